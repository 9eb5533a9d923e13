//! `progbench matrix`: flags to a [`progbench::matrix::Setup`], the run, the table and the files.

use super::*;
use progbench::engines::EngineProfile;
use progbench::families::Family;
use progbench::matrix::{self, Pressure};

pub(crate) fn matrix(cmd: Cmd) -> Result<bool, String> {
    let Cmd::Matrix {
        families,
        pressures,
        seeds,
        half,
        quick,
        scale,
        ranks,
        program_config,
        engine,
        uncalibrated,
        threads,
        json,
        html,
        bounds,
        headers_only_clients,
    } = cmd
    else {
        return Err("not a matrix".into());
    };
    if ranks == 0 {
        return Err("--ranks must be >= 1".into());
    }
    let scale = scale.unwrap_or(if quick { 0.25 } else { 1.0 });
    if !(scale.is_finite() && scale > 0.0) {
        return Err("--scale must be a finite number > 0".into());
    }
    let program: ProgramSchedulingConfig =
        serde_json::from_str(&program_config).map_err(|e| format!("--program-config: {e}"))?;
    program
        .validate()
        .map_err(|e| format!("--program-config: {e}"))?;
    let mut seeds = if seeds.is_empty() {
        half.seeds()
    } else {
        seeds
    };
    if quick {
        seeds.truncate(1);
    }
    let setup = matrix::Setup {
        families: if families.is_empty() {
            Family::ALL.to_vec()
        } else {
            families
        },
        pressures: if pressures.is_empty() {
            Pressure::ALL.to_vec()
        } else {
            pressures
        },
        seeds,
        ranks,
        scale,
        max_model_len: 32768,
        program,
        engine,
        uncalibrated,
        bounds,
        headers_only: headers_only_clients,
        threads: threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
    };
    let pairs = setup.families.len() * setup.seeds.len();
    eprintln!(
        "{} families × {} pressures × seeds {:?} on {} ranks, {} threads ...",
        setup.families.len(),
        setup.pressures.len(),
        setup.seeds,
        ranks,
        setup.threads
    );
    let started = std::time::Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let runs = matrix::run(&setup, &|f, s| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        eprintln!("  [{n}/{pairs}] {} seed {s}", f.name());
    });
    let cells = matrix::cells(&runs);
    let header = format!(
        "{} ranks × vllm-sim's engine model ({}{}), virtual time; seeds {:?}; Programs × \
         {scale}{}; {:.0} s wall.\nfloor = consistent hashing with KV nothing fills; excess = mean JCT − \
         floor; demand = the floor's live KV at p90 over the cell's KV;\n\
         ours÷aff = ours' mean JCT over affinity only's (`binding_only`: the same Program-to-rank \
         binding with nothing held back), above 1 where holding did not pay.\n\
         * = a family that helped choose the defaults (with the odd seeds); the rest are held out.",
        ranks,
        engine.name(),
        if uncalibrated && engine != EngineProfile::Reference {
            ", the router not calibrated to it"
        } else {
            ""
        },
        setup.seeds,
        if headers_only_clients {
            "; clients identify Programs by headers only"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    println!("{header}\n");
    print!("{}", progbench::matrix_report::table(&cells));
    println!();
    print!("{}", progbench::matrix_report::summary(&cells));
    if bounds {
        println!();
        print!("{}", progbench::matrix_report::bounds(&cells));
    }
    let html = html.unwrap_or_else(|| std::env::temp_dir().join("progbench-matrix.html"));
    write_report(&html, &progbench::matrix_report::html(&header, &cells))?;
    if let Some(p) = json {
        write_json(
            &p,
            &serde_json::json!({
                "engine": engine,
                "calibrated": !uncalibrated,
                "headers_only_clients": headers_only_clients,
                "runs": runs,
                "cells": cells
            }),
        )?;
    }
    Ok(true)
}
