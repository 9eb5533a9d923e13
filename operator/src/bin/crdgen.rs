//! `crdgen`: prints the ProgramScheduling CustomResourceDefinition as YAML (written to `crds/`).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    match program_operator::crd_yaml() {
        Ok(y) => {
            print!("{y}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
