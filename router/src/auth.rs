//! Client authentication: the keys clients must present on the proxied routes, their names, and
//! the directory of named keys that the router re-reads while it runs.
//!
//! Keys come from three places: `api_key` (vLLM's own rule: clients present the workers' key),
//! `client_api_keys` (a list; each key is named `key-<hash>` after its content) and
//! `client_api_keys_dir` (one key per file, named after the file — a Kubernetes Secret mounted as
//! a volume gives exactly this layout). The name of the key a client presented is who the client
//! is: fair queueing's `tenant_source: api_key` uses it as the tenant.
//!
//! The directory is polled (`crate::run::loops::key_dir`); a changed key set is applied once two reads a moment
//! apart agree (a Secret volume swaps its files with one symlink, but a reader can straddle the
//! swap). A directory that cannot be read, holds no key, or holds an invalid one keeps the keys
//! already loaded and is reported on `/status` and in the log; at start it is a fatal error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::config::RouterConfig;
use crate::error::ApiError;

/// Longest key name (a Kubernetes Secret data key is at most 253 characters).
const MAX_NAME: usize = 253;

/// Most keys one directory may hold.
const MAX_KEYS: usize = 10_000;

/// Largest key file.
const MAX_KEY_BYTES: u64 = 4096;

/// How often the directory is read.
pub const POLL: Duration = Duration::from_secs(1);

/// One key a client may present, and its name.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientKey {
    pub name: Arc<str>,
    key: Box<[u8]>,
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientKey({:?})", self.name)
    }
}

impl ClientKey {
    /// The key at `index` of a list given without names (`client_api_keys`), named after its
    /// position (`key-0`, `key-1`, ...): nothing about a name may derive from the key.
    pub fn listed(index: usize, key: &[u8]) -> Self {
        ClientKey {
            name: format!("key-{index}").into(),
            key: key.into(),
        }
    }
}

/// The name of a key the router does not check (fair queueing's `api_key` tenant without a
/// key list): an HMAC of it under a key drawn at random when the process starts, so the name
/// stays the same while the process runs and tells nothing about the key, even to someone who
/// can guess it (an unkeyed hash of a weak key could be reversed by trying candidates).
pub fn opaque_name(key: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    static PROCESS_KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let k = PROCESS_KEY.get_or_init(rand::random);
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(k) else {
        return "key-unnamed".into();
    };
    mac.update(key);
    let tag = mac.finalize().into_bytes();
    let mut name = String::from("key-");
    for b in &tag[..8] {
        name.push_str(&format!("{b:02x}"));
    }
    name
}

/// The header Anthropic's clients carry their key in (Claude Code with `ANTHROPIC_API_KEY`).
pub static X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// The key a client presented: its `Authorization: Bearer` token, else its `x-api-key`.
pub fn presented_key(headers: &http::HeaderMap) -> Option<&[u8]> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().as_bytes());
    bearer
        .or_else(|| headers.get(&X_API_KEY).map(|v| v.as_bytes().trim_ascii()))
        .filter(|t| !t.is_empty())
}

/// The key among `keys` equal to `token`, compared in constant time over all of them.
fn find<'a>(keys: &'a [ClientKey], token: &[u8]) -> Option<&'a ClientKey> {
    let mut found = subtle::Choice::from(0);
    let mut index = 0u32;
    for (i, k) in keys.iter().enumerate() {
        let eq = k.key.ct_eq(token);
        index = u32::conditional_select(&index, &(i as u32), eq);
        found |= eq;
    }
    bool::from(found).then(|| &keys[index as usize])
}

/// The keys of a directory, as last loaded, and the last error reading it.
#[derive(Debug, Clone)]
pub struct DirKeys {
    pub dir: PathBuf,
    pub keys: Arc<[ClientKey]>,
    pub loaded_at: SystemTime,
    /// Why the newest read was not applied (the keys above stay in force).
    pub error: Option<String>,
}

impl DirKeys {
    /// Loads `dir` now; the error names the directory or the file.
    pub fn load(dir: &Path) -> Result<Self, String> {
        Ok(DirKeys {
            dir: dir.to_path_buf(),
            keys: read_dir(dir)?.into(),
            loaded_at: SystemTime::now(),
            error: None,
        })
    }
}

/// Reads every key file of `dir`: each entry whose name does not start with `.` (a Secret
/// volume keeps its own bookkeeping in `..data` and timestamped `..` folders) and that is, or
/// links to, a regular file. Its trimmed content is the key and its file name the key's name.
pub fn read_dir(dir: &Path) -> Result<Vec<ClientKey>, String> {
    let shown = dir.display();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the key directory {shown}: {e}"))?;
    let mut keys: Vec<ClientKey> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read the key directory {shown}: {e}"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(format!(
                "{shown}: the file name {name:?} is not UTF-8 (it names a client)"
            ));
        };
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows links, as a Secret volume's files are links into its current `..data`.
        let meta = std::fs::metadata(&path)
            .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?;
        if !meta.is_file() {
            continue;
        }
        if meta.len() > MAX_KEY_BYTES {
            return Err(format!(
                "the key file {} is larger than {MAX_KEY_BYTES} bytes",
                path.display()
            ));
        }
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?;
        let key = bytes.trim_ascii();
        if key.is_empty() || http::HeaderValue::from_bytes(key).is_err() || key.contains(&b' ') {
            return Err(format!(
                "the key file {} must hold one key of printable ASCII without spaces",
                path.display()
            ));
        }
        if name.len() > MAX_NAME {
            return Err(format!(
                "{shown}: the key name {name:?} is longer than {MAX_NAME} bytes"
            ));
        }
        if let Some(other) = keys.iter().find(|k| *k.key == *key) {
            return Err(format!(
                "{shown}: {:?} and {name:?} hold the same key (a key must name one client)",
                other.name
            ));
        }
        keys.push(ClientKey {
            name: name.into(),
            key: key.into(),
        });
        if keys.len() > MAX_KEYS {
            return Err(format!("{shown} holds more than {MAX_KEYS} keys"));
        }
    }
    if keys.is_empty() {
        return Err(format!(
            "the key directory {shown} holds no key (an empty Secret would lock every client out)"
        ));
    }
    keys.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(keys)
}

/// The keys in force for one request: the applied configuration's and the key directory's.
#[derive(Clone, Copy, Default)]
pub struct Keys<'a> {
    /// `client_api_keys` (or `api_key` alone): `None` when neither names a key.
    pub listed: Option<&'a [ClientKey]>,
    /// The key directory's keys, when the configuration names a directory.
    pub dir: Option<&'a DirKeys>,
    /// Keys name clients (see [`named_clients`]).
    pub named: bool,
    /// The workers' `api_key`, which reads all of `/scheduling/diagnostics`.
    pub workers_key: Option<&'a str>,
    /// `client_api_keys` lists at least one key.
    pub any_listed: bool,
}

/// Who the client of `headers` is under `keys`: the name of the key it presented, 401 without
/// a valid one, or `Ok(None)` when keys do not tell clients apart (none configured, or only the
/// workers' `api_key`, which every client shares).
pub fn authorize(keys: &Keys<'_>, headers: &http::HeaderMap) -> Result<Option<Arc<str>>, ApiError> {
    if keys.listed.is_none() && keys.dir.is_none() {
        return Ok(None);
    }
    let Some(token) = presented_key(headers) else {
        return Err(ApiError::unauthorized());
    };
    // Both sets are searched whatever the first finds, so timing does not say which holds it.
    let listed = keys.listed.and_then(|k| find(k, token));
    let named = keys.dir.and_then(|d| find(&d.keys, token));
    match named.or(listed) {
        Some(k) if keys.named => Ok(Some(k.name.clone())),
        Some(_) => Ok(None),
        None => Err(ApiError::unauthorized()),
    }
}

/// Who may read `/scheduling/diagnostics` and what: `Ok(None)` for the whole document (no key
/// is configured at all, or the request presents the workers' `api_key`, which only the
/// platform holds), `Ok(Some(name))` for client `name`'s Programs only, or 401 — whenever any
/// key is configured, a request without a valid one reads nothing.
pub fn diagnostics_scope(
    keys: &Keys<'_>,
    headers: &http::HeaderMap,
) -> Result<Option<Arc<str>>, ApiError> {
    if let (Some(key), Some(token)) = (keys.workers_key, presented_key(headers))
        && bool::from(key.as_bytes().ct_eq(token))
    {
        return Ok(None);
    }
    if keys.named {
        return match authorize(keys, headers)? {
            Some(name) => Ok(Some(name)),
            None => Err(ApiError::unauthorized()),
        };
    }
    if keys.workers_key.is_some() || keys.any_listed {
        return Err(ApiError::unauthorized());
    }
    Ok(None)
}

/// The listed keys clients may present under `config` (see `RouterConfig::client_api_keys`);
/// with a key directory and no list, the workers' key is not one of them.
pub fn client_keys(config: &RouterConfig) -> Option<Arc<[ClientKey]>> {
    let keys: Vec<&String> = match (
        &config.client_api_keys,
        &config.client_api_keys_dir,
        &config.api_key,
    ) {
        (Some(list), _, _) => list.iter().collect(),
        (None, None, Some(key)) => vec![key],
        _ => Vec::new(),
    };
    if keys.is_empty() {
        return None;
    }
    Some(
        keys.into_iter()
            .enumerate()
            .map(|(i, k)| ClientKey::listed(i, k.as_bytes()))
            .collect(),
    )
}

/// Whether clients have keys of their own under `config` (a non-empty `client_api_keys`, or a
/// key directory); `client_api_keys: []` turns checking off and names no one.
pub fn named_clients(config: &RouterConfig) -> bool {
    config
        .client_api_keys
        .as_ref()
        .is_some_and(|l| !l.is_empty())
        || config.client_api_keys_dir.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(token).expect("header"),
        );
        h
    }

    #[test]
    fn find_returns_the_matching_key_among_many() {
        let keys: Vec<ClientKey> = ["alpha", "beta", "gamma"]
            .iter()
            .enumerate()
            .map(|(i, k)| ClientKey::listed(i, k.as_bytes()))
            .collect();
        assert_eq!(find(&keys, b"beta").map(|k| &*k.name), Some(&*keys[1].name));
        assert_eq!(
            find(&keys, b"gamma").map(|k| &*k.name),
            Some(&*keys[2].name)
        );
        assert!(find(&keys, b"delta").is_none());
        assert!(find(&keys, b"bet").is_none());
        assert!(find(&[], b"x").is_none());
    }

    #[test]
    fn a_bearer_token_or_else_an_x_api_key() {
        assert_eq!(presented_key(&headers("Bearer k1")), Some(&b"k1"[..]));
        assert_eq!(presented_key(&headers("bearer  k1 ")), Some(&b"k1"[..]));
        assert_eq!(presented_key(&headers("Basic k1")), None);
        assert_eq!(presented_key(&headers("Bearer ")), None);
        assert_eq!(presented_key(&http::HeaderMap::new()), None);
        let mut anthropic = http::HeaderMap::new();
        anthropic.insert(&X_API_KEY, http::HeaderValue::from_static(" k2 "));
        assert_eq!(presented_key(&anthropic), Some(&b"k2"[..]));
        let mut both = headers("Bearer k1");
        both.insert(&X_API_KEY, http::HeaderValue::from_static("k2"));
        assert_eq!(
            presented_key(&both),
            Some(&b"k1"[..]),
            "Authorization first"
        );
    }

    #[test]
    fn a_directory_of_named_keys_as_a_secret_volume_lays_it_out() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        testkit::secret_volume::write(
            dir,
            1,
            &[
                ("search-team", b"sk-search\n"),
                ("nightly-evals", b"sk-evals"),
            ],
        );
        let keys = read_dir(dir).expect("keys");
        let names: Vec<&str> = keys.iter().map(|k| &*k.name).collect();
        assert_eq!(names, ["nightly-evals", "search-team"]);
        assert_eq!(
            find(&keys, b"sk-search").map(|k| &*k.name),
            Some("search-team"),
            "the trailing newline is not part of the key"
        );
    }

    #[test]
    fn bad_directories_are_refused_with_the_reason() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        let err = read_dir(&dir.join("missing")).expect_err("missing");
        assert!(err.contains("cannot read the key directory"), "{err}");
        let err = read_dir(dir).expect_err("empty");
        assert!(err.contains("holds no key"), "{err}");
        std::fs::write(dir.join("a"), "same").expect("write");
        std::fs::write(dir.join("b"), "same\n").expect("write");
        let err = read_dir(dir).expect_err("duplicate");
        assert!(err.contains("hold the same key"), "{err}");
        std::fs::write(dir.join("b"), "two words").expect("write");
        let err = read_dir(dir).expect_err("space");
        assert!(err.contains("/b must hold one key"), "{err}");
        std::fs::write(dir.join("b"), "\n").expect("write");
        let err = read_dir(dir).expect_err("blank");
        assert!(err.contains("/b must hold one key"), "{err}");
        std::fs::write(dir.join("b"), "other").expect("write");
        std::fs::create_dir(dir.join("sub")).expect("mkdir");
        assert_eq!(read_dir(dir).expect("keys").len(), 2, "folders are skipped");
    }
}
