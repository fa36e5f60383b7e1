//! The `latchkey` subcommands. Each file parses its flags and wires library pieces together;
//! no domain logic lives here.

pub mod controller;
pub mod demo;
pub mod kubelet;
pub mod node;

/// Default socket: where kubelet looks for the `csi.latchkey.dev` plugin.
pub const DEFAULT_ENDPOINT: &str = "unix:///var/lib/kubelet/plugins/csi.latchkey.dev/csi.sock";

/// Parses a byte size: a plain number or a Kubernetes quantity with a binary suffix (`Ki`, `Mi`, `Gi`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 4Mi or 65536"))?;
    let mult = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(format!("{s:?}: unit must be Ki, Mi or Gi")),
    };
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("4Mi"), Ok(4 << 20));
        assert_eq!(super::parse_size("65536"), Ok(65536));
        assert!(super::parse_size("4MB").is_err());
        assert!(super::parse_size("0").is_err());
        assert!(super::parse_size("Mi").is_err());
    }
}
