//! Hostile drafter: tries to read a file, an environment variable and the network in `new` and
//! `propose`; panics with "sandbox escape: ..." if any attempt succeeds, otherwise logs what was
//! denied at warn level and proposes nothing.
//!
//! So a host test can load it, run a request, and assert that it never trapped: a trap means
//! the sandbox let something through (the panic message says what).

use std::net::{TcpStream, UdpSocket};

use spechost_sdk::{Drafter, Level, ModelFacts, Proposal, Token, export_drafter, log};

/// Probes the sandbox on every call that may do work.
pub struct FileOpen;

impl Drafter for FileOpen {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        probe_sandbox("new");
        Ok(Self)
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        probe_sandbox("propose");
        Proposal::empty()
    }
}

export_drafter!(FileOpen);

/// Tries each forbidden operation; panics on the first that succeeds, logs the denials if none
/// does.
fn probe_sandbox(method: &str) {
    let mut denied = Vec::new();
    match std::fs::read_to_string("/etc/hostname") {
        Ok(contents) => panic!("sandbox escape: read /etc/hostname: {:?}", contents.trim()),
        Err(error) => denied.push(format!("read /etc/hostname ({error})")),
    }
    match std::env::var("HOME") {
        Ok(home) => panic!("sandbox escape: environment variable HOME is {home:?}"),
        Err(error) => denied.push(format!("env HOME ({error})")),
    }
    match TcpStream::connect("127.0.0.1:80") {
        Ok(_) => panic!("sandbox escape: TCP connection to 127.0.0.1:80"),
        Err(error) => denied.push(format!("connect 127.0.0.1:80 ({error})")),
    }
    // A refused connection proves little (nothing may listen on port 80); binding a UDP
    // socket succeeds whenever the network is reachable at all.
    match UdpSocket::bind("127.0.0.1:0") {
        Ok(_) => panic!("sandbox escape: bound a UDP socket on 127.0.0.1"),
        Err(error) => denied.push(format!("bind udp 127.0.0.1:0 ({error})")),
    }
    log(
        Level::Warn,
        &format!(
            "hostile-fileopen: sandbox denied, in {method}: {}",
            denied.join("; ")
        ),
    );
}
