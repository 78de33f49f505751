//! The baseline of the HTTP benchmark: a bare actix-web route answering the same
//! JSON a volume list returns, with no authentication, rate limiting or storage.
//! Run: cargo run --release -p gantry-api --example bare_json -- 127.0.0.1:8090 [workers]
use actix_web::{App, HttpResponse, HttpServer, web};
use serde_json::json;

async fn list() -> HttpResponse {
    let volume = |i: u32| json!({"id": format!("vol{i:07}"), "name": "bench", "size": 50, "dataCenter": "EU-RO-1", "type": "STANDARD"});
    HttpResponse::Ok().json(json!({"networkVolumes": (0..3).map(volume).collect::<Vec<_>>()}))
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8090".into());
    let workers = args.next().and_then(|w| w.parse().ok()).unwrap_or(2);
    actix_web::rt::System::new().block_on(async move {
        HttpServer::new(|| App::new().route("/v2/network-volumes", web::get().to(list)))
            .workers(workers)
            .bind(addr)?
            .run()
            .await
    })
}
