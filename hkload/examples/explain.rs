//! Which code object of each module a device would run, and why: the smallest program that
//! uses hkload (and the one whose size the README's "A minimal hkload" reports).
//!
//! ```text
//! cargo run -p hkload --example explain -- dist/hk-kernels-0.1.0 gfx942:sramecc+:xnack-
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(bundle), Some(device)) = (args.next(), args.next()) else {
        eprintln!(
            "usage: explain <bundle folder> <target ID, e.g. gfx942:sramecc+:xnack- or sm_90>"
        );
        return ExitCode::from(2);
    };
    let device = match device.parse() {
        Ok(device) => device,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    match hkload::Bundle::open(&bundle) {
        Ok(bundle) => {
            print!("{}", bundle.explain(&device));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
