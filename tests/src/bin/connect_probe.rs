//! Tries to read a sidecar's greeting at the socket given as argument and prints `greeted`, or
//! `refused: <why>` (used by the socket test to connect as another uid).

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;

fn main() {
    let path = std::env::args().nth(1).unwrap_or_default();
    match UnixStream::connect(&path) {
        Err(e) => println!("refused: {e}"),
        Ok(s) => {
            let mut line = String::new();
            let _ = BufReader::new(s).read_line(&mut line);
            if line.contains("sidecar_hello") {
                println!("greeted");
            } else {
                println!("refused: {}", line.trim());
            }
        }
    }
}
