//! The `--endpoint` syntax kubelet's node-driver-registrar uses: `unix:///abs/path.sock`.

use std::path::PathBuf;

/// Turns `unix:///path`, `unix:/path` or a bare path into a socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if path.is_empty() {
        return Err(format!("endpoint {endpoint:?} names no socket path"));
    }
    if endpoint.contains("://") && !endpoint.starts_with("unix://") {
        return Err(format!(
            "endpoint {endpoint:?}: only unix sockets are supported"
        ));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("/tmp/x.sock").unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
        assert!(socket_path("unix://").is_err());
    }
}
