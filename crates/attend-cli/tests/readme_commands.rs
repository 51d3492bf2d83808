//! The README's shell blocks run as written: every command line of them either runs
//! here (an `attend` command, or `cargo run -p attend-cli --`, both as this build's
//! binary, in the repository's root, with the model `scripts/fetch-model` installs)
//! and succeeds with output, or is one the README's set-up consists of, which other
//! tests run (`attend serve` and its `curl` lines: the server's Python tests; the
//! installs and `scripts/test`: CI itself).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::model_dir;

/// Command lines other tests run, by their first words.
const RUN_ELSEWHERE: &[&str] = &[
    "cargo install --path crates/attend-cli",
    "pip install ./crates/attend-py",
    "scripts/test",
    "attend serve",
    "curl ",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every command line of the README's `sh` blocks, continuation lines joined and
/// comments dropped.
fn commands(readme: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = readme;
    while let Some(start) = rest.find("```sh\n") {
        let body = &rest[start + 6..];
        let end = body
            .find("```")
            .expect("an unterminated sh block in the README");
        let joined = body[..end].replace("\\\n", " ");
        for line in joined.lines() {
            let line = line.split(" # ").next().unwrap_or("").trim();
            if !line.is_empty() && !line.starts_with('#') {
                out.push(line.to_owned());
            }
        }
        rest = &body[end + 3..];
    }
    out
}

#[test]
fn the_readmes_shell_commands_run_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = commands(&readme);
    assert!(lines.len() >= 5, "the README's sh blocks hold {lines:?}");
    // `attend` on PATH is this build's binary, as `cargo install` would put it there.
    let bin_dir = tempdir();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_attend"), bin_dir.join("attend")).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for line in &lines {
        if RUN_ELSEWHERE.iter().any(|p| line.starts_with(p)) {
            continue;
        }
        let command = line.replace("cargo run --release -p attend-cli --", "attend");
        assert!(
            command.starts_with("attend "),
            "a README command this test neither runs nor knows to be run elsewhere: {line}"
        );
        let out = Command::new("bash")
            .args(["-c", &command])
            .current_dir(repo())
            .env("PATH", &path)
            .env("ATTEND_MODEL_DIR", model_dir())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{line}\nexit {:?}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty(), "{line} printed nothing");
        ran += 1;
    }
    assert!(ran >= 2, "only {ran} README commands ran");
}

/// The README's notebook-000 block ends with the context vectors the notebook
/// prints, and the command above it prints them.
#[test]
fn the_readmes_notebook_output_is_what_the_command_prints() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme.find("### The notebooks, exactly").unwrap()..];
    let command = commands(section).into_iter().next().unwrap();
    let shown = section
        .split("```text\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let args = shell_words(command.strip_prefix("attend ").unwrap());
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(&args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        printed.contains(shown.trim_end()),
        "the README shows\n{shown}\nthe command printed\n{printed}"
    );
}

/// Splits a command line the way the shell would for the README's quoting: single
/// quotes group, nothing else is special.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attend-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("attend"));
    dir
}

/// Every relative link and image of the README and docs/*.md names a file or
/// folder of the repository.
#[test]
fn the_readmes_and_docs_links_resolve() {
    let mut pages = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in text
            .split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
        {
            let target = target.split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let resolved = page.parent().unwrap().join(target);
            assert!(
                resolved.exists(),
                "{}: the link {target} names nothing",
                page.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} links found");
}
