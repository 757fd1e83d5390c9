//! A private `dbus-daemon`, killed on drop. Shared by the tests and the
//! benchmarks (`benches/common` includes this file).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Bus {
    child: Child,
    pub address: String,
}

impl Bus {
    /// A bus with tests/data/dbus/bus.conf: anyone may connect and call.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e} (.ci/run installs dbus-daemon)"))
    }

    /// A bus with the configuration file `config`.
    pub fn start_with(config: &Path) -> Self {
        Self::try_start_with(config)
            .unwrap_or_else(|e| panic!("{e} (.ci/run installs dbus-daemon)"))
    }

    /// [`Bus::start`], or why it cannot.
    pub fn try_start() -> Result<Self, String> {
        Self::try_start_with(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dbus/bus.conf"),
        )
    }

    /// [`Bus::start_with`], or why it cannot.
    pub fn try_start_with(config: &Path) -> Result<Self, String> {
        use std::io::BufRead;
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--print-address=1", "--nofork"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run dbus-daemon: {e}"))?;
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let bus = |address: String| Self { child, address };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.trim().starts_with("unix:") => Ok(bus(line.trim().to_owned())),
            Ok(line) => {
                drop(bus(String::new()));
                Err(format!(
                    "dbus-daemon printed {:?}, not an address",
                    line.trim()
                ))
            }
            Err(_) => {
                drop(bus(String::new()));
                Err("dbus-daemon printed no address within 30 s".to_owned())
            }
        }
    }
}

impl Drop for Bus {
    /// Killed, the daemon leaves its socket file (`unix:tmpdir=` names
    /// one in /tmp): it is removed here.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let socket = self
            .address
            .strip_prefix("unix:")
            .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("path=")));
        if let Some(socket) = socket {
            let _ = std::fs::remove_file(socket);
        }
    }
}
