//! [`ShareTarget`]: where `serve --share redis://HOST:PORT[/NAMESPACE]` shares, checked.

/// Namespace of `--share` URLs that name none.
pub const DEFAULT_NAMESPACE: &str = "spechost";

/// A Redis server and the namespace replicas share in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareTarget {
    /// `redis://[USER:PASSWORD@]HOST:PORT`, for the client.
    pub server: String,
    /// The prefix of every key; replicas share only within one.
    pub namespace: String,
}

impl ShareTarget {
    /// Parses `redis://[USER:PASSWORD@]HOST[:PORT][/NAMESPACE]`; the error says what is wrong
    /// and what to write instead.
    pub fn parse(url: &str) -> Result<Self, String> {
        let example = "write e.g. redis://127.0.0.1:6379/my-service";
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| format!("it must start with redis://; {example}"))?;
        let (authority, namespace) = match rest.split_once('/') {
            Some((authority, "")) => (authority, DEFAULT_NAMESPACE),
            Some((authority, namespace)) => (authority, namespace),
            None => (rest, DEFAULT_NAMESPACE),
        };
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        if host.is_empty() || host.starts_with(':') {
            return Err(format!("it names no host; {example}"));
        }
        if let Some((_, port)) = host.rsplit_once(':')
            && !host.ends_with(']')
            && port.parse::<u16>().is_err()
        {
            return Err(format!(
                "port `{port}` is not a number below 65536; {example}"
            ));
        }
        if namespace.is_empty()
            || namespace.len() > 64
            || !namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!(
                "namespace `{namespace}` must be 1 to 64 letters, digits, `-`, `_` or `.`; {example}"
            ));
        }
        Ok(Self {
            server: format!("redis://{authority}"),
            namespace: namespace.to_owned(),
        })
    }

    /// The server without its password, for logs and `/health`.
    pub fn display_server(&self) -> String {
        match self.server.rsplit_once('@') {
            Some((_, host)) => format!("redis://***@{host}"),
            None => self.server.clone(),
        }
    }

    /// The key `suffix` of this namespace (`NAMESPACE:suffix`).
    pub fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_and_namespace() {
        let target = ShareTarget::parse("redis://127.0.0.1:6379/tenant-a").expect("valid");
        assert_eq!(target.server, "redis://127.0.0.1:6379");
        assert_eq!(target.namespace, "tenant-a");
        assert_eq!(target.key("responses"), "tenant-a:responses");
        let default = ShareTarget::parse("redis://cache.internal").expect("valid");
        assert_eq!(default.namespace, DEFAULT_NAMESPACE);
        assert_eq!(
            ShareTarget::parse("redis://localhost:6379/")
                .expect("valid")
                .namespace,
            DEFAULT_NAMESPACE
        );
        let secret = ShareTarget::parse("redis://me:s3cret@10.0.0.2:6380/x").expect("valid");
        assert_eq!(secret.server, "redis://me:s3cret@10.0.0.2:6380");
        assert_eq!(secret.display_server(), "redis://***@10.0.0.2:6380");
    }

    #[test]
    fn refuses_what_it_cannot_use_and_says_why() {
        for (url, says) in [
            ("http://127.0.0.1:6379", "must start with redis://"),
            ("redis://", "names no host"),
            ("redis://:6379/x", "names no host"),
            ("redis://host:99999/x", "not a number"),
            ("redis://host:6379/a/b", "namespace `a/b`"),
            ("redis://host:6379/has space", "namespace"),
        ] {
            let error = ShareTarget::parse(url).expect_err(url);
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}
