//! Shared by the benchmarks: full or smoke run, sizes, statistics, the
//! table, the binaries built beside the benchmark, a private bus and the
//! comparison tools' virtualenv.
//!
//! `cargo bench` passes `--bench` and gets the full run on the release
//! build (driven by `bench/run`). `cargo test` runs the same binaries
//! without it (`test = true` in Cargo.toml): a smoke run on the debug build
//! with small sizes, so every code path of the benchmarks runs in CI and its
//! assertions (all servers running, exactly one PID changed by a reload, …)
//! hold. Smoke figures are not measurements.

#![allow(dead_code)] // each benchmark uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../tests/helper/bus.rs"]
mod bus;

#[allow(unused_imports)] // the supervisor benchmark needs no bus
pub use bus::Bus;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Full,
    Smoke,
}

impl Mode {
    pub fn detect() -> Self {
        if std::env::args().any(|a| a == "--bench") {
            Mode::Full
        } else {
            Mode::Smoke
        }
    }

    /// `full` or `smoke` by mode; the environment variable `name` overrides
    /// both.
    pub fn size(self, name: &str, full: usize, smoke: usize) -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(match self {
                Mode::Full => full,
                Mode::Smoke => smoke,
            })
    }

    /// Says what kind of run this is, before the first table.
    pub fn announce(self) {
        if self == Mode::Smoke {
            println!(
                "smoke run ({} build, small sizes): proves the benchmarks work; \
                 the figures are not measurements. The full run is bench/run.\n",
                profile_dir()
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            );
        }
    }
}

/// `target/<profile>`: the benchmark binary lives in its `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("benchmark binary lives in target/<profile>/deps")
        .to_owned()
}

/// A binary built by the same cargo invocation: `mcpd`, `mcpctl`,
/// `examples/mcp-fixture`.
pub fn binary(relative: &str) -> PathBuf {
    let path = profile_dir().join(relative);
    assert!(
        path.is_file(),
        "{} is missing: run bench/run (or cargo test, which builds the examples)",
        path.display()
    );
    path
}

/// Median, 95th percentile, minimum, maximum and count of a sample.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub p50: f64,
    pub p95: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

pub fn stats(mut xs: Vec<f64>) -> Stats {
    assert!(!xs.is_empty(), "no samples");
    xs.sort_by(f64::total_cmp);
    let pick = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    Stats {
        p50: pick(0.5),
        p95: pick(0.95),
        min: xs[0],
        max: xs[xs.len() - 1],
        runs: xs.len(),
    }
}

/// One table row.
pub struct Row {
    pub figure: String,
    pub target: String,
    pub median: String,
    pub spread: String,
    pub runs: usize,
    /// Whether the figure meets its target; `None` without one.
    pub met: Option<bool>,
}

impl Row {
    pub fn new(
        figure: impl Into<String>,
        target: impl Into<String>,
        median: impl Into<String>,
        spread: impl Into<String>,
        runs: usize,
    ) -> Self {
        Self {
            figure: figure.into(),
            target: target.into(),
            median: median.into(),
            spread: spread.into(),
            runs,
            met: None,
        }
    }

    /// Judges the row against its target.
    pub fn met(mut self, met: bool) -> Self {
        self.met = Some(met);
        self
    }

    /// A row of milliseconds with `decimals` places.
    pub fn ms(
        figure: impl Into<String>,
        target: impl Into<String>,
        s: Stats,
        decimals: usize,
    ) -> Self {
        Self::new(
            figure,
            target,
            format!("{:.decimals$} ms", s.p50),
            format!(
                "p95 {:.decimals$}, {:.decimals$}..{:.decimals$} ms",
                s.p95, s.min, s.max
            ),
            s.runs,
        )
    }

    /// A comparison that could not run, and why.
    pub fn skipped(figure: impl Into<String>, reason: &str) -> Self {
        Self::new(figure, "-", format!("skipped: {reason}"), "-", 0)
    }

    /// A row with a target that could not run, and why: it counts as not
    /// met (a target nobody measured is not a target met).
    pub fn skipped_target(figure: impl Into<String>, target: &str, reason: &str) -> Self {
        Self::new(figure, target, format!("skipped: {reason}"), "-", 0).met(false)
    }

    /// `a` against `b`, trial by trial (see [`Ratio`]): the median of the
    /// trials' `a.p50 / b.p50`, the medians of their p50s beside it, the
    /// trials' spread of the ratio and the p95s. Judge it on
    /// [`Ratio::median`].
    pub fn ratio(
        figure: impl Into<String>,
        target: impl Into<String>,
        r: &Ratio,
        then: &str,
    ) -> Self {
        Self::new(
            figure,
            target,
            format!("{:.3} ms vs {:.3} ms: {:.2}×{then}", r.a, r.b, r.median),
            format!(
                "trials {:.2}..{:.2}×; p95 {:.3} vs {:.3} ms",
                r.min, r.max, r.a95, r.b95
            ),
            r.runs,
        )
    }
}

/// How many times each target row is measured within one run
/// (`MCPD_BENCH_TRIALS`: 3; 1 in a smoke run): the verdict is taken on the
/// median of the trials, and their spread is shown.
pub fn trials() -> usize {
    Mode::detect().size("MCPD_BENCH_TRIALS", 3, 1).max(1)
}

/// Trials of one comparison: per trial, the p50 of `a` over the p50 of
/// `b` (each trial's calls taken in turn, so a slow spell of the machine
/// falls on both alike).
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    /// The median of the trials' ratios, and its range.
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Medians over the trials of each side's p50 and p95, in ms.
    pub a: f64,
    pub b: f64,
    pub a95: f64,
    pub b95: f64,
    /// Calls of `a` in all trials.
    pub runs: usize,
}

impl Ratio {
    pub fn of(pairs: &[(Stats, Stats)]) -> Self {
        let ratios = stats(pairs.iter().map(|(a, b)| a.p50 / b.p50).collect());
        let median = |f: fn(&(Stats, Stats)) -> f64| stats(pairs.iter().map(f).collect()).p50;
        Self {
            median: ratios.p50,
            min: ratios.min,
            max: ratios.max,
            a: median(|(a, _)| a.p50),
            b: median(|(_, b)| b.p50),
            a95: median(|(a, _)| a.p95),
            b95: median(|(_, b)| b.p95),
            runs: pairs.iter().map(|(a, _)| a.runs).sum(),
        }
    }

    /// The same trials, each's difference `a.p50 - b.p50` in ms.
    pub fn difference(pairs: &[(Stats, Stats)]) -> Stats {
        stats(pairs.iter().map(|(a, b)| a.p50 - b.p50).collect())
    }
}

/// Prints `rows` as a Markdown table under `title`, with a verdict for each
/// row that has a target (full runs only).
pub fn print_table(title: &str, rows: &[Row]) {
    println!("## {title}\n");
    println!("| figure | target | median | p95, min..max | runs | met |");
    println!("|---|---|---|---|---:|---|");
    for r in rows {
        assert!(!r.median.is_empty(), "row {:?} has no figure", r.figure);
        // A smoke run's figures are not measurements: no verdicts.
        let met = match r.met.filter(|_| Mode::detect() == Mode::Full) {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        println!(
            "| {} | {} | {} | {} | {} | {met} |",
            r.figure, r.target, r.median, r.spread, r.runs
        );
    }
    println!();
}

/// Resident set size of process `pid` ("self" for this one), in KiB.
pub fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The comparison tools (`supervisord` from PyPI `supervisor`, `mcp-proxy`)
/// in a virtualenv of their own under `target/bench-venv`, so they never
/// change the system Python's packages (mcp-proxy pins an older `mcp`).
/// Returns the path of `tool`, installing on first use, or why it cannot.
pub fn venv_tool(tool: &str) -> Result<PathBuf, String> {
    let venv = profile_dir()
        .parent()
        .expect("target dir")
        .join("bench-venv");
    let path = venv.join("bin").join(tool);
    if path.is_file() {
        return Ok(path);
    }
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "{what} failed: {}",
                err.lines().last().unwrap_or("no output").trim()
            ))
        }
    };
    if !venv.join("bin/pip").is_file() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        )?;
    }
    run(
        Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            // Offline, give up in about a minute rather than pip's default
            // of five retries per request.
            "--retries",
            "1",
            "--timeout",
            "30",
            "supervisor",
            "mcp-proxy",
        ]),
        "pip install supervisor mcp-proxy",
    )?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("pip installed no {}", path.display()))
    }
}

/// A comparison tool from npm (`package@version`, pinned) in a prefix of
/// its own under `target/bench-npm`, as [`venv_tool`] keeps PyPI's: the
/// path of its `bin`, installed on first use when `install`, or why it
/// cannot be had (a smoke run never installs: it must not need the
/// network).
pub fn npm_tool(package: &str, version: &str, bin: &str, install: bool) -> Result<PathBuf, String> {
    let prefix = profile_dir()
        .parent()
        .expect("target dir")
        .join("bench-npm");
    let path = prefix.join("node_modules/.bin").join(bin);
    let wanted = format!("\"version\": \"{version}\"");
    let installed = std::fs::read_to_string(
        prefix
            .join("node_modules")
            .join(package)
            .join("package.json"),
    )
    .is_ok_and(|manifest| manifest.contains(&wanted));
    if installed && path.is_file() {
        return Ok(path);
    }
    if !install {
        return Err(format!(
            "{package}@{version} is not installed in {} (the full run, bench/run, installs it)",
            prefix.display()
        ));
    }
    let out = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(&prefix)
        .arg(format!("{package}@{version}"))
        // Offline, give up in about a minute.
        .args(["--fetch-retries", "1", "--fetch-timeout", "30000"])
        .output()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "npm install {package}@{version} failed: {}",
            err.lines().last().unwrap_or("no output").trim()
        ));
    }
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("npm installed no {}", path.display()))
    }
}
