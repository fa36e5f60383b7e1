//! The PushSecret controller: a Secret of a namespace, or a generator's output, written into
//! stores as the PushSecret's service account. The source read (as the account, [`source`]; a
//! generator run as the account, [`generated`]), the plan (what each remote
//! secret receives, and the record of what was pushed, so unchanged data costs no backend
//! write), the optional CEL template over the source ([`template`]), the writer of each store
//! ([`pushers`]) and the watch loop run by `latchkey controller` ([`controller`]).

pub mod controller;
pub mod generated;
pub mod plan;
pub mod pushers;
pub mod source;
pub mod template;
