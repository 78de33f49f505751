//! A private redis-server child process per test, never the shared one on 6379.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server owned by one test, on its own port, killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("no free local port")
            .port();
        let mut server = RedisServer { port, child: None };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port, with empty memory, and waits until it answers.
    pub fn spawn(&mut self) {
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{bin}` ({e}): the Redis tests need redis-server \
                     (apt-get install redis-server, or set REDIS_SERVER=/path/to/redis-server)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.answers_ping() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("redis-server on port {} exited early: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} never answered",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP / SIGCONT: the server keeps its sockets but stops answering.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server not running").id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    /// A separate connection for inspecting the server.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
