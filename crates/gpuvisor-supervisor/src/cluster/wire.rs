//! The head–agent protocol: message types and a line-framed JSON connection.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::control::{PsRow, Request};
use crate::supervisor::SummaryRow;

/// What an agent sends to the head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum AgentMsg {
    /// The first message: who this agent is.
    Hello {
        /// The secret the head gave every agent (so a stray connection is refused).
        token: String,
        /// This node's name (`SLURMD_NODENAME`, else the host name).
        node: String,
        /// The agent's pid on its node.
        pid: u32,
    },
    /// The node is planned; the agent holds a listening port for each world it coordinates.
    Planned {
        /// The node's GPUs (`gpuvisor gpus --json` data), from which the head plans the node
        /// the same way for the job's merged plan.
        inventory: Value,
        /// World (process name) -> the port reserved for its coordinator on this node.
        ports: BTreeMap<String, u16>,
    },
    /// The results of a [`HeadMsg::Probe`], one per target.
    Probed {
        /// Per target.
        results: Vec<ProbeResult>,
    },
    /// One line of the node's `events.jsonl`, as written.
    Event {
        /// The line, without its newline.
        line: String,
    },
    /// The node's replicas now (sent every second).
    Ps {
        /// The rows of the node's control socket's `ps`.
        rows: Vec<PsRow>,
    },
    /// The node's latest sampler snapshot.
    Sample {
        /// `{"cmd":"sample"}`'s `sample`.
        sample: Value,
    },
    /// The node's share of the job ended.
    Done {
        /// Its supervisor's exit status.
        status: u8,
        /// Its summary rows.
        rows: Vec<SummaryRow>,
    },
    /// The agent could not do what it was asked (plan the node, create its record...).
    Failed {
        /// What went wrong, as it would be printed.
        message: String,
        /// True for a problem in the job file or the command line (exit status 2).
        bad_input: bool,
    },
}

/// What the head sends to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub enum HeadMsg {
    /// Plan your node.
    Assign {
        /// The job file's path as the user gave it (for messages and relative paths).
        job_path: PathBuf,
        /// The job file's text, as the head read it.
        job_source: String,
        /// Every node of the step, in order.
        nodes: Vec<String>,
        /// This agent's node's index in `nodes`.
        index: usize,
        /// Where the node keeps its own record (`<run>/nodes/<node>/`, on a file system every
        /// node shares).
        record: PathBuf,
        /// The job's `logs/` directory (shared too).
        logs: PathBuf,
        /// `--simulate` of the head, for every node.
        simulate: Option<String>,
        /// `--quiet` of the head.
        quiet: bool,
    },
    /// Check that these coordinators can be reached.
    Probe {
        /// What to reach.
        targets: Vec<ProbeTarget>,
        /// How long each may take.
        timeout_ms: u64,
    },
    /// Start the node's processes.
    Start {
        /// World -> its coordinator.
        coordinators: BTreeMap<String, ProbeTarget>,
    },
    /// Do not start; end now.
    Abort {
        /// Why (printed by the agent).
        reason: String,
    },
    /// A control request for the node's supervisor (stop, restart, ps).
    Control {
        /// The request.
        request: Request,
    },
    /// Sent every second while the job runs: an agent that hears nothing from its head for
    /// three times `[cluster] node_timeout` (its machine gone, the network cut) stops its
    /// node's share.
    Heartbeat,
}

/// A coordinator to reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTarget {
    /// The world (process name) it coordinates.
    pub world: String,
    /// Its node's name (resolved by each agent).
    pub host: String,
    /// The port.
    pub port: u16,
}

/// One probe's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// What was probed.
    pub target: ProbeTarget,
    /// How long the connection took, ms, when it worked.
    pub ms: Option<u64>,
    /// The error, when it did not.
    pub error: Option<String>,
}

/// The sending half of a connection (cloneable across threads by `try_clone`).
#[derive(Debug)]
pub struct Sender {
    stream: TcpStream,
}

impl Sender {
    /// Sends one message as one line.
    pub fn send<T: Serialize>(&mut self, message: &T) -> io::Result<()> {
        let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
        line.push(b'\n');
        self.stream.write_all(&line)
    }

    /// Another handle on the same connection.
    pub fn try_clone(&self) -> io::Result<Sender> {
        Ok(Sender {
            stream: self.stream.try_clone()?,
        })
    }

    /// Closes both directions (the peer's reads end).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The receiving half of a connection.
#[derive(Debug)]
pub struct Receiver {
    reader: BufReader<TcpStream>,
    line: String,
}

impl Receiver {
    /// The next message; `Ok(None)` when the peer closed the connection. A line that is not a
    /// message is an `InvalidData` error naming it. A read that times out (see
    /// [`Receiver::set_timeout`]) keeps the part of a line it got for the next call.
    pub fn recv<T: DeserializeOwned>(&mut self) -> io::Result<Option<T>> {
        if self.reader.read_line(&mut self.line)? == 0 && self.line.is_empty() {
            return Ok(None);
        }
        let line = std::mem::take(&mut self.line);
        serde_json::from_str(line.trim_end())
            .map(Some)
            .map_err(|error| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not a gpuvisor message ({error}): {:.200}", line.trim_end()),
                )
            })
    }

    /// Limits how long [`Receiver::recv`] waits (`None`: forever).
    pub fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(timeout)
    }
}

/// Splits a connected stream into its halves (TCP_NODELAY: messages are small and
/// latency-bound).
pub fn split(stream: TcpStream) -> io::Result<(Sender, Receiver)> {
    stream.set_nodelay(true)?;
    let reader = BufReader::new(stream.try_clone()?);
    Ok((
        Sender { stream },
        Receiver {
            reader,
            line: String::new(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn messages_cross_a_connection_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let (mut sender, mut receiver) = split(TcpStream::connect(address).unwrap()).unwrap();
            sender
                .send(&AgentMsg::Hello {
                    token: "t".into(),
                    node: "n1".into(),
                    pid: 7,
                })
                .unwrap();
            let reply: HeadMsg = receiver.recv().unwrap().unwrap();
            reply
        });
        let (stream, _) = listener.accept().unwrap();
        let (mut sender, mut receiver) = split(stream).unwrap();
        let hello: AgentMsg = receiver.recv().unwrap().unwrap();
        assert_eq!(
            hello,
            AgentMsg::Hello {
                token: "t".into(),
                node: "n1".into(),
                pid: 7
            }
        );
        let abort = HeadMsg::Abort {
            reason: "preflight failed".into(),
        };
        sender.send(&abort).unwrap();
        assert_eq!(client.join().unwrap(), abort);
        // The client is gone: the stream ends.
        assert!(receiver.recv::<AgentMsg>().unwrap().is_none());
    }

    #[test]
    fn a_line_that_is_not_a_message_is_an_error_naming_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(address).unwrap();
            stream.write_all(b"GET / HTTP/1.0\n").unwrap();
        });
        let (stream, _) = listener.accept().unwrap();
        let (_, mut receiver) = split(stream).unwrap();
        client.join().unwrap();
        let error = receiver.recv::<AgentMsg>().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("GET / HTTP"), "{error}");
    }

    #[test]
    fn a_message_split_across_a_timed_out_read_arrives_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (go_on, wait) = std::sync::mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(address).unwrap();
            stream.write_all(br#"{"msg":"abort","#).unwrap();
            wait.recv().unwrap();
            stream.write_all(br#""reason":"x"}"#).unwrap();
            stream.write_all(b"\n").unwrap();
        });
        let (stream, _) = listener.accept().unwrap();
        let (_, mut receiver) = split(stream).unwrap();
        receiver
            .set_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let error = receiver.recv::<HeadMsg>().unwrap_err();
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{error}"
        );
        go_on.send(()).unwrap();
        receiver.set_timeout(Some(Duration::from_secs(5))).unwrap();
        let message: HeadMsg = receiver.recv().unwrap().unwrap();
        assert_eq!(message, HeadMsg::Abort { reason: "x".into() });
        client.join().unwrap();
        assert!(receiver.recv::<HeadMsg>().unwrap().is_none());
    }
}
