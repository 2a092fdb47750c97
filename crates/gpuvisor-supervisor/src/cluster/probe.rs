//! The preflight reachability check: the node that will run a world's coordinator holds its
//! port open with a [`ProbeListener`] while every node [`probe`]s it, so a missing route, a
//! firewall or a name that does not resolve is found before any training process starts,
//! instead of as a silent hang at the first collective.
//!
//! The listener answers each connection with a banner line naming the world, so a probe that
//! reached some other program on that port fails. The prober closes first, which leaves the
//! TIME_WAIT on its side, not on the port the coordinator binds next (std's listeners set
//! SO_REUSEADDR as well).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A port held open for a coordinator during preflight.
#[derive(Debug)]
pub struct ProbeListener {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The line a [`ProbeListener`] sends for `world`.
fn banner(world: &str) -> String {
    format!("gpuvisor-preflight {world}\n")
}

impl ProbeListener {
    /// Binds a free port on every interface (the coordinator will bind it the same way) and
    /// answers probes for `world` until [`ProbeListener::close`].
    pub fn bind(world: &str) -> io::Result<ProbeListener> {
        let listener = TcpListener::bind(("0.0.0.0", 0))?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            let banner = banner(world);
            std::thread::Builder::new()
                .name("gpuvisor-probe".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((stream, _)) => answer(stream, &banner),
                            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(10)),
                        }
                    }
                })?
        };
        Ok(ProbeListener {
            port,
            stop,
            thread: Some(thread),
        })
    }

    /// The port it holds.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops answering and frees the port (for the coordinator to bind).
    pub fn close(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ProbeListener {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// Sends the banner and waits (briefly) for the prober to close first.
fn answer(stream: TcpStream, banner: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut stream = stream;
    if stream.write_all(banner.as_bytes()).is_ok() {
        let mut rest = Vec::new();
        let _ = io::Read::read_to_end(&mut stream, &mut rest);
    }
}

/// Connects to `host:port` within `timeout` and checks that a [`ProbeListener`] for `world`
/// answers. Ok: how long it took. Err: what failed, in words (`cannot resolve n1`,
/// `10.0.0.1:4000: No route to host`, `timed out after 5 s`...).
pub fn probe(host: &str, port: u16, world: &str, timeout: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let addresses: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve {host}: {error}"))?
        .collect();
    let mut last_error = format!("cannot resolve {host}: no address");
    for address in addresses {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        match try_address(address, world, left) {
            Ok(()) => return Ok(started.elapsed()),
            Err(error) => last_error = format!("{address}: {error}"),
        }
    }
    if started.elapsed() >= timeout {
        return Err(format!(
            "{last_error} (gave up after {:.1} s)",
            timeout.as_secs_f64()
        ));
    }
    Err(last_error)
}

fn try_address(address: SocketAddr, world: &str, timeout: Duration) -> Result<(), String> {
    let stream = TcpStream::connect_timeout(&address, timeout).map_err(|error| {
        if error.kind() == io::ErrorKind::TimedOut {
            format!("no answer within {:.1} s", timeout.as_secs_f64())
        } else {
            error.to_string()
        }
    })?;
    stream
        .set_read_timeout(Some(timeout.max(Duration::from_millis(100))))
        .map_err(|error| error.to_string())?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|error| format!("connected, but no preflight answer: {error}"))?;
    if line != banner(world) {
        return Err(format!(
            "connected, but something else answers on that port ({:?})",
            line.trim_end().chars().take(60).collect::<String>()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_answers_for_its_world_only() {
        let listener = ProbeListener::bind("learner").unwrap();
        let port = listener.port();
        let took = probe("127.0.0.1", port, "learner", Duration::from_secs(2)).unwrap();
        assert!(took < Duration::from_secs(2));
        let error = probe("localhost", port, "actor", Duration::from_secs(2)).unwrap_err();
        assert!(error.contains("something else answers"), "{error}");
        listener.close();
        // Closed: the port is free again (the coordinator can bind it) and probes fail.
        let rebound = TcpListener::bind(("0.0.0.0", port)).unwrap();
        drop(rebound);
        let error = probe("127.0.0.1", port, "learner", Duration::from_secs(1)).unwrap_err();
        assert!(error.contains("refused"), "{error}");
    }

    #[test]
    fn two_worlds_on_one_node_hold_two_ports_each_answering_for_its_own() {
        let learner = ProbeListener::bind("learner").unwrap();
        let trainer = ProbeListener::bind("trainer").unwrap();
        assert_ne!(learner.port(), trainer.port());
        let timeout = Duration::from_secs(2);
        probe("127.0.0.1", learner.port(), "learner", timeout).unwrap();
        probe("127.0.0.1", trainer.port(), "trainer", timeout).unwrap();
        assert!(probe("127.0.0.1", trainer.port(), "learner", timeout).is_err());
        // One closing leaves the other answering.
        learner.close();
        probe("127.0.0.1", trainer.port(), "trainer", timeout).unwrap();
    }

    #[test]
    fn an_unknown_host_is_named() {
        let error =
            probe("no-such-host.invalid", 1, "learner", Duration::from_secs(1)).unwrap_err();
        assert!(
            error.starts_with("cannot resolve no-such-host.invalid"),
            "{error}"
        );
    }

    #[test]
    fn a_silent_address_times_out_within_the_limit() {
        // 10.255.255.1 is unrouted in most places; where the route is refused at once the
        // error says so instead, which is also a failed probe.
        let started = Instant::now();
        let error = probe("10.255.255.1", 9, "learner", Duration::from_millis(300)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "{error}");
    }
}
