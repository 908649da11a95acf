//! Which storage a remote cache URL names, as an OpenDAL operator: a shared folder, Redis,
//! WebDAV or S3-compatible object storage. Everything else about the remote (timeouts,
//! verification, statistics) is the same for all of them and lives in [`super::remote`].

use opendal::{Operator, services};
use url::Url;

/// A remote cache URL that hkpack cannot use. The build stops: a mistyped URL is a
/// configuration error, unlike a server that is down.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("remote cache URL `{url}` is not a URL ({detail}); {SCHEMES}")]
    Unparsable { url: String, detail: String },
    #[error(
        "remote cache URL `{url}` has scheme `{scheme}`, which hkpack does not speak; {SCHEMES}"
    )]
    UnknownScheme { url: String, scheme: String },
    #[error("remote cache URL `{url}`: {detail}; {SCHEMES}")]
    Invalid { url: String, detail: String },
    #[error("remote cache `{url}` cannot be set up: {detail}")]
    Service { url: String, detail: String },
}

const SCHEMES: &str = "use file:///shared/path, redis://host:port/db, webdav+http://host:port/path \
     (or http://, https://, webdav+https://) or s3://bucket/prefix?endpoint=URL&region=REGION";

/// S3 credentials given explicitly. Without them the AWS defaults apply: `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, then the shared config files, then the
/// machine's role.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// The storage behind `url`, and the URL as it may be printed (without a password).
pub fn open(
    url: &str,
    s3_credentials: Option<&S3Credentials>,
) -> Result<(Operator, String), StorageError> {
    let parsed = Url::parse(url).map_err(|e| StorageError::Unparsable {
        url: url.to_owned(),
        detail: e.to_string(),
    })?;
    let shown = printable(&parsed);
    let invalid = |detail: &str| StorageError::Invalid {
        url: shown.clone(),
        detail: detail.to_owned(),
    };
    let operator = match parsed.scheme() {
        "file" => folder(&parsed).map_err(|d| invalid(&d))?,
        "redis" | "rediss" => redis(&parsed).map_err(|d| invalid(&d))?,
        "webdav+http" | "webdav+https" | "http" | "https" => {
            webdav(&parsed).map_err(|d| invalid(&d))?
        }
        "s3" => s3(&parsed, s3_credentials).map_err(|d| invalid(&d))?,
        other => {
            return Err(StorageError::UnknownScheme {
                url: shown,
                scheme: other.to_owned(),
            });
        }
    };
    let operator = operator.map_err(|e| StorageError::Service {
        url: shown.clone(),
        detail: e.to_string(),
    })?;
    Ok((operator, shown))
}

/// What a builder made: the operator, or OpenDAL's reason it could not.
type Built = opendal::Result<Operator>;

/// `file:///mnt/cache`: a folder, typically a shared mount.
fn folder(url: &Url) -> Result<Built, String> {
    if url
        .host_str()
        .is_some_and(|h| !h.is_empty() && h != "localhost")
    {
        return Err("a file URL names a local path (file:///path)".into());
    }
    let path = url
        .to_file_path()
        .map_err(|()| "the path is not absolute".to_owned())?;
    let root = path
        .to_str()
        .ok_or_else(|| "the path is not UTF-8".to_owned())?;
    Ok(Operator::new(services::Fs::default().root(root)).map(|b| b.finish()))
}

/// `redis://[user:password@]host:port[/db]` (or `rediss://` for TLS).
fn redis(url: &Url) -> Result<Built, String> {
    let host = url.host_str().ok_or("a Redis URL needs a host")?;
    let port = url.port().unwrap_or(6379);
    let db = match url.path().trim_matches('/') {
        "" => 0,
        db => db
            .parse::<i64>()
            .map_err(|_| format!("`{db}` is not a Redis database number"))?,
    };
    let mut builder = services::Redis::default()
        .endpoint(&format!("{}://{host}:{port}", url.scheme()))
        .db(db);
    if !url.username().is_empty() {
        builder = builder.username(url.username());
    }
    if let Some(password) = url.password() {
        builder = builder.password(password);
    }
    Ok(Operator::new(builder).map(|b| b.finish()))
}

/// `webdav+http://[user:password@]host:port/path`, and the same with `https` or without
/// the `webdav+` prefix.
fn webdav(url: &Url) -> Result<Built, String> {
    let scheme = url.scheme().trim_start_matches("webdav+");
    let host = url.host_str().ok_or("a WebDAV URL needs a host")?;
    let endpoint = match url.port() {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    };
    let mut builder = services::Webdav::default()
        .endpoint(&endpoint)
        .root(url.path());
    if !url.username().is_empty() {
        builder = builder.username(url.username());
    }
    if let Some(password) = url.password() {
        builder = builder.password(password);
    }
    Ok(Operator::new(builder).map(|b| b.finish()))
}

/// `s3://bucket[/prefix][?endpoint=URL][&region=REGION]`: AWS, or any S3-compatible
/// service at `endpoint` (addressed by path, as MinIO and Ceph expect).
fn s3(url: &Url, credentials: Option<&S3Credentials>) -> Result<Built, String> {
    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or("an S3 URL names its bucket: s3://bucket/prefix")?;
    let mut builder = services::S3::default().bucket(bucket).root(url.path());
    for (name, value) in url.query_pairs() {
        builder = match name.as_ref() {
            "endpoint" => builder.endpoint(&value),
            "region" => builder.region(&value),
            other => {
                return Err(format!(
                    "unknown S3 parameter `{other}` (known: endpoint, region)"
                ));
            }
        };
    }
    if let Some(credentials) = credentials {
        builder = builder
            .access_key_id(&credentials.access_key_id)
            .secret_access_key(&credentials.secret_access_key);
    }
    Ok(Operator::new(builder).map(|b| b.finish()))
}

/// The URL without its password, for messages and summaries.
fn printable(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_hkpack_documents_opens() {
        for url in [
            "file:///tmp/hkpack-remote",
            "redis://127.0.0.1:6379/2",
            "rediss://user:secret@cache.example:6380",
            "webdav+http://127.0.0.1:8080/hkpack",
            "https://dav.example/cache",
            "s3://bucket/ci?endpoint=http://127.0.0.1:9000&region=us-east-1",
        ] {
            if let Err(e) = open(url, None) {
                panic!("{url}: {e}");
            }
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong_and_hide_passwords() {
        let message = |url: &str| open(url, None).err().map(|e| e.to_string()).unwrap();
        let unknown = message("ftp://host/cache");
        assert!(unknown.contains("scheme `ftp`"), "{unknown}");
        assert!(unknown.contains("redis://host:port/db"), "{unknown}");
        let db = message("redis://:hunter2@127.0.0.1:6379/zero");
        assert!(db.contains("`zero` is not a Redis database number"), "{db}");
        assert!(!db.contains("hunter2"), "{db}");
        let parameter = message("s3://bucket?bucket_region=x");
        assert!(
            parameter.contains("unknown S3 parameter `bucket_region`"),
            "{parameter}"
        );
        assert!(message("cache-dir").contains("is not a URL"));
    }
}
