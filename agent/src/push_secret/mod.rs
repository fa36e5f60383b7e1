//! The PushSecret controller's pieces: a Secret of a namespace written into stores as the
//! PushSecret's service account. This slice holds the source read (as the account, [`source`]),
//! the plan (what each remote secret receives) and the record of what was pushed, so that
//! unchanged data costs no backend write; the watch loop that runs them in `latchkey controller`
//! comes next.

pub mod plan;
pub mod source;
