//! Worker authentication at the gRPC edge.

use gantry_proto::v1::scheduler_message;
use gantry_worker_sdk::{Credentials, WorkerError};
use tonic::Code;

use crate::harness::{ECHO, SECRET, Server, Worker, hello, raw_connect, token, worker_config};

#[tokio::test]
async fn a_stream_without_token_is_unauthenticated() {
    let server = Server::start();
    let status = raw_connect(&server.url(), None, hello("w", &[ECHO], 1))
        .await
        .err()
        .expect("accepted without a token");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let status = raw_connect(&server.url(), Some("Basic abc".into()), hello("w", &[ECHO], 1))
        .await
        .err()
        .expect("accepted a non-bearer credential");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

#[tokio::test]
async fn a_valid_token_is_accepted_and_acknowledged() {
    let server = Server::start();
    let bearer = format!("Bearer {}", token("w-raw", &[ECHO], SECRET));
    let mut raw = raw_connect(&server.url(), Some(bearer), hello("w-raw", &[ECHO], 1))
        .await
        .unwrap();
    let first = raw.inbound.message().await.unwrap().unwrap();
    match first.kind {
        Some(scheduler_message::Kind::HelloAck(ack)) => {
            assert_eq!(ack.scheduler_id, "gantry");
            assert_eq!(ack.heartbeat_interval_ms, 5_000);
        }
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

#[tokio::test]
async fn tokens_must_match_the_hello() {
    let server = Server::start();
    let cases = [
        // Signed with another secret.
        (
            token("w", &[ECHO], b"wrong"),
            hello("w", &[ECHO], 1),
            Code::Unauthenticated,
        ),
        // Token for another worker.
        (
            token("other", &[ECHO], SECRET),
            hello("w", &[ECHO], 1),
            Code::PermissionDenied,
        ),
        // Model not covered by the token.
        (
            token("w", &["x"], SECRET),
            hello("w", &[ECHO], 1),
            Code::PermissionDenied,
        ),
        // Unusable hello.
        (
            token("w", &[ECHO], SECRET),
            hello("w", &[ECHO], 0),
            Code::InvalidArgument,
        ),
        (token("w", &[ECHO], SECRET), hello("w", &[], 1), Code::InvalidArgument),
    ];
    for (jwt, hello, code) in cases {
        let status = raw_connect(&server.url(), Some(format!("Bearer {jwt}")), hello.clone())
            .await
            .err()
            .unwrap_or_else(|| panic!("{hello:?} was accepted"));
        assert_eq!(status.code(), code, "{hello:?}: {status:?}");
    }
    assert!(server.dispatcher.workers().is_empty());
}

#[tokio::test]
async fn an_sdk_worker_with_a_bad_credential_stops_with_unauthenticated() {
    let server = Server::start();
    for credentials in [
        Credentials::Secret(b"not the secret".to_vec()),
        Credentials::Token("not.a.jwt".into()),
    ] {
        let mut config = worker_config(&server.url(), "w-bad", 1);
        config.credentials = credentials;
        let worker = Worker::spawn(gantry_model_echo::EchoModel, config);
        match worker.finished().await {
            Err(WorkerError::Rejected(status)) => {
                assert_eq!(status.code(), Code::Unauthenticated, "{status:?}")
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
    assert!(server.dispatcher.workers().is_empty());
}

#[tokio::test]
async fn an_sdk_worker_with_a_pre_minted_token_connects() {
    let mut server = Server::start();
    let mut config = worker_config(&server.url(), "w-token", 1);
    config.credentials = Credentials::Token(token("w-token", &[ECHO], SECRET));
    let _worker = Worker::spawn(gantry_model_echo::EchoModel, config);
    server.wait_capacity(ECHO).await;
    assert_eq!(server.dispatcher.workers()[0].worker_id, "w-token");
}
