//! Calls through a balanced HTTP service and the answers they got (`STATUS BODY`), shared by
//! the routing tests (`tags.rs`, `stages.rs`).

use std::collections::BTreeSet;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};

pub type Req = http::Request<Full<Bytes>>;

pub fn request(headers: &[(&str, &str)]) -> Req {
    let mut b = http::Request::get("/greet");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::default()).unwrap()
}

pub async fn answered_by<S, B>(
    svc: &mut S,
    headers: &[(&str, &str)],
    n: usize,
) -> Result<BTreeSet<String>, String>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: std::fmt::Display,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let resp = svc
            .ready()
            .await
            .map_err(|e| e.to_string())?
            .call(request(headers))
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        seen.insert(format!(
            "{} {}",
            status.as_u16(),
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(seen)
}

pub fn set(v: &[&str]) -> Result<BTreeSet<String>, String> {
    Ok(v.iter().map(|s| s.to_string()).collect())
}
