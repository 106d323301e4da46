//! The node-once decoder against prost's own: the same requests from the same bytes, but for
//! the node after the first.

use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use proptest::prelude::*;

use super::*;

fn node(id: &str, extensions: usize) -> Node {
    Node {
        id: id.to_owned(),
        cluster: "bench".to_owned(),
        extensions: (0..extensions)
            .map(|i| Extension {
                name: format!("envoy.ext.{i}"),
                category: "envoy.filters".to_owned(),
                type_urls: vec![format!("type.googleapis.com/ext.{i}")],
                ..Extension::default()
            })
            .collect(),
        ..Node::default()
    }
}

fn sotw() -> impl Strategy<Value = DiscoveryRequest> {
    (
        "[a-z0-9]{0,8}",
        proptest::collection::vec("[a-z]{1,6}", 0..6),
        "[a-z./]{0,20}",
        "[0-9]{0,4}",
        proptest::option::of(("[a-z]{1,5}", 0..40usize)),
        proptest::option::of("[ -~]{0,20}"),
    )
        .prop_map(
            |(version, names, type_url, nonce, node_of, error)| DiscoveryRequest {
                version_info: version,
                resource_names: names,
                type_url,
                response_nonce: nonce,
                node: node_of.map(|(id, n)| node(&id, n)),
                error_detail: error.map(|message| RpcStatus {
                    code: 3,
                    message,
                    ..RpcStatus::default()
                }),
                ..DiscoveryRequest::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x6e6f_6465),
        ..ProptestConfig::default()
    })]

    /// A stream's first request with a node decodes exactly as prost decodes it; every later
    /// one too, but without its node.
    #[test]
    fn the_first_node_is_decoded_and_later_ones_skipped(first in sotw(), later in proptest::collection::vec(sotw(), 1..4)) {
        let mut decoder = NodeOnceDecoder::<DiscoveryRequest>::new();
        let mut seen = false;
        for request in std::iter::once(first).chain(later) {
            let bytes = request.encode_to_vec();
            let ours = decoder.decode_request(&mut &bytes[..]).unwrap();
            let mut want = DiscoveryRequest::decode(&bytes[..]).unwrap();
            if seen {
                want.node = None;
            }
            seen |= request.node.is_some();
            prop_assert_eq!(ours, want);
        }
    }

    /// Before any node, any bytes decode (or fail) exactly as prost's: the same code runs.
    #[test]
    fn arbitrary_bytes_agree_with_prost(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let ours = NodeOnceDecoder::<DiscoveryRequest>::new().decode_request(&mut &bytes[..]);
        let theirs = DiscoveryRequest::decode(&bytes[..]);
        prop_assert_eq!(ours.ok(), theirs.ok());
        let ours = NodeOnceDecoder::<DeltaDiscoveryRequest>::new().decode_request(&mut &bytes[..]);
        let theirs = DeltaDiscoveryRequest::decode(&bytes[..]);
        prop_assert_eq!(ours.ok(), theirs.ok());
    }
}

#[test]
fn a_delta_stream_keeps_its_subscriptions_and_drops_the_repeated_node() {
    let mut decoder = NodeOnceDecoder::<DeltaDiscoveryRequest>::new();
    let request = DeltaDiscoveryRequest {
        node: Some(node("envoy-1", 300)),
        type_url: "t".to_owned(),
        resource_names_subscribe: vec!["a".to_owned(), "b".to_owned()],
        response_nonce: "7".to_owned(),
        ..DeltaDiscoveryRequest::default()
    };
    let bytes = request.encode_to_vec();
    let first = decoder.decode_request(&mut &bytes[..]).unwrap();
    assert_eq!(first, request);
    let again = decoder.decode_request(&mut &bytes[..]).unwrap();
    assert_eq!(again.node, None);
    assert_eq!(
        DeltaDiscoveryRequest {
            node: request.node.clone(),
            ..again
        },
        request
    );
}
