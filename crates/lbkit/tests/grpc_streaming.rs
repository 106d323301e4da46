//! Server-streaming gRPC through `lbkit proxy` (h2c upstreams, round robin) with tonic on both
//! sides: three `echo_server` backends on 127.0.0.1, a tonic client over one h2c connection
//! to the proxy. Each `Repeat` call is one request balanced once: all its replies come from one
//! backend, in full, with the backend's status; calls in flight together share the connection.

#[path = "faults/procs.rs"]
#[allow(dead_code)] // the fault run's process handling; this test uses part of it
mod procs;

#[path = "../../lbkit-tower/examples/echo_server.rs"]
#[allow(dead_code)] // its `main` is the example's
mod echo_server;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use echo_server::echo::echo_client::EchoClient;
use echo_server::echo::RepeatRequest;
use procs::{free_port, Proxy};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Bound on the whole test's calls.
const WAIT: Duration = Duration::from_secs(30);

/// Three backends named `b0`..`b2`; dropping the senders stops them.
async fn backends() -> (Vec<SocketAddr>, Vec<oneshot::Sender<()>>) {
    let (mut addrs, mut stops) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let (stop, stopped) = oneshot::channel();
        let any = "127.0.0.1:0".parse().expect("an address");
        let addr = echo_server::serve(any, &format!("b{i}"), stopped)
            .await
            .expect("a backend listens");
        addrs.push(addr);
        stops.push(stop);
    }
    (addrs, stops)
}

/// `lbkit proxy` in front of `endpoints`, h2c both ways, round robin.
async fn proxy(endpoints: &[SocketAddr], dir: &std::path::Path) -> Proxy {
    let (listen, admin) = (free_port().expect("port"), free_port().expect("port"));
    let list: Vec<String> = endpoints.iter().map(|a| format!("\"{a}\"")).collect();
    let config = format!(
        "[admin]\nbind = \"127.0.0.1:{admin}\"\n\n[[listener]]\nbind = \"127.0.0.1:{listen}\"\n\n\
         [[route]]\nservice = \"echo\"\n\n[service.echo]\nendpoints = [{}]\n\
         strategy = \"round-robin\"\nh2c = true\n",
        list.join(", ")
    );
    let path = dir.join("proxy.toml");
    std::fs::write(&path, config).expect("write the config");
    Proxy::start(&path, dir).await.expect("the proxy starts")
}

/// One `Repeat` call: the replies' servers, in order, or the call's status.
async fn repeat(
    client: &mut EchoClient<Channel>,
    message: &str,
    count: u32,
) -> Result<Vec<String>, tonic::Status> {
    let request = RepeatRequest {
        message: message.to_owned(),
        count,
    };
    let mut replies = client.repeat(request).await?.into_inner();
    let mut servers = Vec::new();
    while let Some(reply) = replies.message().await? {
        assert_eq!(
            reply.message, message,
            "each reply echoes the call's message"
        );
        servers.push(reply.server);
    }
    Ok(servers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_streaming_calls_stream_whole_from_one_backend_each() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (endpoints, _stops) = backends().await;
    let proxy = proxy(&endpoints, dir.path()).await;
    let channel = Channel::from_shared(format!("http://{}", proxy.listen))
        .expect("a URI")
        .connect_lazy();
    let client = EchoClient::new(channel);

    // Twelve calls at once, 200 replies each, on the one connection.
    let calls = (0..12).map(|i| {
        let mut client = client.clone();
        async move { repeat(&mut client, &format!("call {i}"), 200).await }
    });
    let answers = tokio::time::timeout(WAIT, futures_util::future::join_all(calls))
        .await
        .expect("the calls finish in time");
    let mut by_server = BTreeMap::<String, usize>::new();
    for (i, answer) in answers.into_iter().enumerate() {
        let servers = answer.unwrap_or_else(|s| panic!("call {i}: {s:?}"));
        assert_eq!(servers.len(), 200, "call {i}: every reply arrives");
        assert!(
            servers.iter().all(|s| *s == servers[0]),
            "call {i}: one backend answers a whole call: {servers:?}"
        );
        *by_server.entry(servers[0].clone()).or_default() += 1;
    }
    // Round robin: twelve calls, four a backend.
    assert_eq!(by_server.len(), 3, "{by_server:?}");
    assert!(by_server.values().all(|&n| n == 4), "{by_server:?}");

    // A backend's refusal comes back as its status, with nothing streamed.
    let mut client = client.clone();
    let refused = tokio::time::timeout(WAIT, repeat(&mut client, "too many", 20_000))
        .await
        .expect("an answer in time")
        .expect_err("over MAX_REPEAT is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("20000"), "{refused:?}");
}
