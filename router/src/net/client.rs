//! The pooled HTTP client of health checks, metric scrapes, peer calls and calibration; proxied
//! requests use their backend's own idle connections instead (`crate::workers::idle`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

/// A pooled client over plain HTTP.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the pooled upstream client.
pub fn client() -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    http.enforce_http(true);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(http)
}
