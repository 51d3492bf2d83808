//! The hostile outputs, streams and signals of issue 47: every output path ends as
//! the user expects (a device stays a device, a FIFO's reader gets the bytes, a
//! link stays a link and its target is written), or is refused in one line before
//! any work; a closed pipe ends quietly with status 141, a full disk is one line;
//! a signal or an error leaves no temporary file; a huge or endless input is
//! bounded. Never a panic, a replaced special file or a `.attend-*` file left.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Long enough for a model to load on a busy machine; a run that hangs fails.
const DEADLINE: Duration = Duration::from_secs(120);

/// Linux's `O_NONBLOCK`: opening a FIFO with it never waits for the other end.
const O_NONBLOCK: i32 = 0o4000;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attend-outputs-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn attend_cmd(args: &[&str], dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attend"));
    cmd.args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "1")
        .env("ATTEND_MODEL_DIR", common::model_dir());
    cmd
}

/// Waits for `child`, killing it and failing past the deadline.
fn finish(mut child: Child, what: &str) -> (i32, Vec<u8>, String) {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > DEADLINE {
            child.kill().unwrap();
            panic!("{what}: still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `attend args` in `dir` with standard output piped; returns (exit code,
/// stdout, stderr, the process id).
fn attend(args: &[&str], dir: &Path) -> (i32, Vec<u8>, String, u32) {
    let child = attend_cmd(args, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (code, out, err) = finish(child, &format!("{args:?}"));
    (code, out, err, pid)
}

/// The `.attend-*` temporary files in `dir`, and those of process `pid` in the
/// system's temporary directory.
fn leftovers(dir: &Path, pid: u32) -> Vec<String> {
    let ours = format!(".attend-{pid}-");
    let named = |d: &Path, prefix: &str| -> Vec<String> {
        fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect()
    };
    let mut left = named(dir, ".attend-");
    left.extend(named(&std::env::temp_dir(), &ours));
    left
}

/// Nothing of `pid`'s temporary files is left in `dir` or the temporary folder.
fn assert_no_leftovers(dir: &Path, pid: u32) {
    let left = leftovers(dir, pid);
    assert!(left.is_empty(), "{left:?}");
}

/// One line on stderr, no panic, no backtrace.
fn assert_one_line(err: &str, words: &[&str]) {
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    for w in words {
        assert!(err.contains(w), "{err:?} does not name {w:?}");
    }
}

/// `attend sdpa` on small inputs in `dir`, with `extra` flags.
fn sdpa(dir: &Path, extra: &[&str]) -> Vec<String> {
    for (name, shape) in [
        ("q", [1, 2, 5, 4]),
        ("k", [1, 2, 7, 4]),
        ("v", [1, 2, 7, 3]),
    ] {
        let a = ndarray::Array4::from_shape_fn(shape, |(_, h, i, j)| {
            ((h * 31 + i * 7 + j * 3) % 11) as f32 * 0.2 - 1.0
        });
        attend::io::npy::write_f32(dir.join(format!("{name}.npy")), a.into_dyn().view()).unwrap();
    }
    let mut args: Vec<String> = ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
        .map(String::from)
        .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The bytes `attend sdpa` writes to a regular `--out`.
fn regular_output(dir: &Path) -> Vec<u8> {
    let args = sdpa(dir, &["--out", "regular.npy"]);
    let (code, _, err, _) = attend(&strs(&args), dir);
    assert_eq!(code, 0, "{err}");
    fs::read(dir.join("regular.npy")).unwrap()
}

/// A character device made with mknod (as `/dev/null`) stays one, and /dev/full
/// is a one-line "no space" error. They used to be replaced by a regular file.
#[test]
fn a_character_device_stays_a_device_and_a_full_one_is_one_line() {
    let dir = scratch("device");
    let made = Command::new("mknod")
        .args(["-m", "666"])
        .arg(dir.join("null.npy"))
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    if made.success() {
        let args = sdpa(&dir, &["--out", "null.npy", "--lse", "/dev/null"]);
        let (code, _, err, pid) = attend(&strs(&args), &dir);
        assert_eq!(code, 0, "{err}");
        let kind = fs::symlink_metadata(dir.join("null.npy"))
            .unwrap()
            .file_type();
        assert!(kind.is_char_device(), "{kind:?}");
        assert_no_leftovers(&dir, pid);
    } else {
        eprintln!("mknod is not permitted here: the device case is skipped");
    }
    let args = sdpa(&dir, &["--out", "/dev/full"]);
    let (code, _, err, pid) = attend(&strs(&args), &dir);
    assert_eq!(code, 2, "{err}");
    assert_one_line(&err, &["/dev/full", "No space left on device"]);
    assert_no_leftovers(&dir, pid);
    fs::remove_dir_all(&dir).unwrap();
}

/// A FIFO's reader receives exactly what a regular file would hold, and the FIFO
/// stays a FIFO (it used to be replaced, its reader left waiting).
#[test]
fn a_fifos_reader_receives_the_output() {
    let dir = scratch("fifo");
    let expected = regular_output(&dir);
    let fifo = dir.join("out.npy");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (sent, received) = std::sync::mpsc::channel();
    let reading = fifo.clone();
    std::thread::spawn(move || {
        let _ = sent.send(fs::read(reading));
    });
    let args = sdpa(&dir, &["--out", "out.npy"]);
    let (code, _, err, pid) = attend(&strs(&args), &dir);
    // A reader still waiting (attend never opened the FIFO) gets an end of file.
    let _ = OpenOptions::new()
        .write(true)
        .custom_flags(O_NONBLOCK)
        .open(&fifo);
    assert_eq!(code, 0, "{err}");
    let got = received
        .recv_timeout(Duration::from_secs(10))
        .expect("the FIFO's reader got nothing")
        .unwrap();
    assert_eq!(got, expected);
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert_no_leftovers(&dir, pid);
    fs::remove_dir_all(&dir).unwrap();
}

/// A symbolic link stays a link and the file it names is written (it used to be
/// replaced by a regular file); a dangling link's target is created.
#[test]
fn a_symlinks_target_is_written_and_the_link_stays() {
    let dir = scratch("symlink");
    let expected = regular_output(&dir);
    fs::create_dir(dir.join("sub")).unwrap();
    fs::write(dir.join("sub/real.npy"), "old").unwrap();
    std::os::unix::fs::symlink("sub/real.npy", dir.join("link.npy")).unwrap();
    std::os::unix::fs::symlink("sub/new.npy", dir.join("dangling.npy")).unwrap();
    let args = sdpa(&dir, &["--out", "link.npy", "--lse", "dangling.npy"]);
    let (code, _, err, pid) = attend(&strs(&args), &dir);
    assert_eq!(code, 0, "{err}");
    for (link, target) in [
        ("link.npy", "sub/real.npy"),
        ("dangling.npy", "sub/new.npy"),
    ] {
        let meta = fs::symlink_metadata(dir.join(link)).unwrap();
        assert!(meta.file_type().is_symlink(), "{link}");
        assert_eq!(fs::read_link(dir.join(link)).unwrap(), Path::new(target));
        assert!(
            fs::metadata(dir.join(target)).unwrap().is_file(),
            "{target}"
        );
    }
    assert_eq!(fs::read(dir.join("sub/real.npy")).unwrap(), expected);
    assert_eq!(
        attend::io::npy::read_f32(dir.join("sub/new.npy"))
            .unwrap()
            .shape(),
        &[1, 2, 5]
    );
    let mut left = leftovers(&dir, pid);
    left.extend(leftovers(&dir.join("sub"), pid));
    assert!(left.is_empty(), "{left:?}");
    fs::remove_dir_all(&dir).unwrap();
}

/// A read-only file is refused and kept as it was (it used to be replaced, mode
/// 0644); a writable file that is replaced keeps its mode.
#[test]
fn a_read_only_file_is_refused_and_a_replaced_file_keeps_its_mode() {
    let dir = scratch("readonly");
    let ro = dir.join("ro.npy");
    fs::write(&ro, "keep").unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o444)).unwrap();
    let args = sdpa(&dir, &["--out", "ro.npy"]);
    let (code, _, err, pid) = attend(&strs(&args), &dir);
    assert_eq!(code, 2, "{err}");
    assert_one_line(&err, &["--out", "ro.npy", "read-only"]);
    assert_eq!(fs::read_to_string(&ro).unwrap(), "keep");
    assert_eq!(
        fs::metadata(&ro).unwrap().permissions().mode() & 0o777,
        0o444
    );
    assert_no_leftovers(&dir, pid);

    let private = dir.join("private.npy");
    fs::write(&private, "old").unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
    let args = sdpa(&dir, &["--out", "private.npy"]);
    let (code, _, err, _) = attend(&strs(&args), &dir);
    assert_eq!(code, 0, "{err}");
    assert_ne!(fs::read(&private).unwrap(), b"old");
    let mode = fs::metadata(&private).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    fs::remove_dir_all(&dir).unwrap();
}

/// A directory as an output is refused before any work (the error names it, not
/// the input that is missing) and leaves no temporary file; with valid inputs it
/// used to leave a complete temporary file beside the error.
#[test]
fn a_directory_is_refused_before_any_work_and_leaves_nothing() {
    let dir = scratch("directory");
    fs::create_dir(dir.join("out.npy")).unwrap();
    let (code, _, err, pid) = attend(
        &[
            "sdpa",
            "--q",
            "missing.npy",
            "--k",
            "missing.npy",
            "--v",
            "missing.npy",
            "--out",
            "out.npy",
        ],
        &dir,
    );
    assert_eq!(code, 2, "{err}");
    assert_one_line(&err, &["--out", "out.npy", "directory"]);
    assert_no_leftovers(&dir, pid);
    let args = sdpa(&dir, &["--out", "out.npy", "--lse", "lse.npy"]);
    let (code, _, err, pid) = attend(&strs(&args), &dir);
    assert_eq!(code, 2, "{err}");
    assert_one_line(&err, &["--out", "directory"]);
    assert_no_leftovers(&dir, pid);
    assert!(!dir.join("lse.npy").exists());
    fs::remove_dir_all(&dir).unwrap();
}

/// SIGTERM and SIGINT in the middle of a corpus run remove the temporary output
/// and exit with 128 + the signal's number; the run is fed from a pipe that stays
/// open, so it is still running when the signal comes.
#[test]
fn a_signal_during_a_corpus_run_leaves_no_temporary_file() {
    for (signal, number) in [("TERM", 15), ("INT", 2)] {
        let dir = scratch(&format!("signal-{signal}"));
        let mut child = attend_cmd(
            &[
                "embed",
                "--input",
                "-",
                "--output",
                "out.npy",
                "--chunk-size",
                "2",
            ],
            &dir,
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let pid = child.id();
        let mut stdin = child.stdin.take().unwrap();
        // Twelve 1536-byte rows: more than the writer buffers, so the temporary
        // file grows while the input is still open.
        std::io::Write::write_all(&mut stdin, "a short line of text\n".repeat(12).as_bytes())
            .unwrap();
        let start = Instant::now();
        let temp = loop {
            let growing = fs::read_dir(&dir).unwrap().find_map(|e| {
                let e = e.unwrap();
                let named = e.file_name().to_string_lossy().starts_with(".attend-");
                (named && e.metadata().unwrap().len() > 0).then(|| e.path())
            });
            if let Some(t) = growing {
                break t;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no temporary output appeared: {:?}",
                child.try_wait()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let sent = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let (code, _, err) = finish(child, signal);
        drop(stdin);
        assert_eq!(code, 128 + number, "SIG{signal}: {err}");
        assert!(!temp.exists(), "SIG{signal} left {}", temp.display());
        assert_no_leftovers(&dir, pid);
        assert!(!dir.join("out.npy").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}

/// `attend … | head -c1`: the reader goes after one byte; attend ends quietly with
/// 141, as a process killed by SIGPIPE does (it used to panic with exit 101).
#[test]
fn a_closed_pipe_ends_quietly_with_141() {
    let dir = scratch("pipe");
    // 200 words: a table of about 300 kB, far more than a pipe holds.
    let sentence = vec!["word"; 200].join(" ");
    let mut child = attend_cmd(
        &["attention", "--layer", "0", "--head", "0", &sentence],
        &dir,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut first = [0u8; 1];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let (code, _, err) = finish(child, "attention | head -c1");
    assert_eq!(code, 141, "{err}");
    assert!(
        err.lines().all(|l| l.starts_with("warning:")),
        "no error and no panic: {err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// Standard output on a full disk is a one-line error with exit 2 in every
/// command, `--help` included (it used to panic, or for --help exit 0).
#[test]
fn a_full_disk_is_one_line_in_every_command() {
    let dir = scratch("full");
    let sdpa_args = sdpa(&dir, &["--out", "/dev/stdout"]);
    let cases: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["embed", "hello"],
        vec!["attention", "--layer", "0", "--head", "0", "hello"],
        vec!["explain", "--sentence", "the cat sat", "--embed-dim", "4"],
        vec!["view", "--sentence", "the cat sat", "--embed-dim", "4"],
        vec![
            "train",
            "--steps",
            "1",
            "--len",
            "2",
            "--d-model",
            "4",
            "--heads",
            "1",
            "--batch",
            "2",
            "--quiet",
        ],
        vec![
            "bench",
            "--seq",
            "8",
            "--heads",
            "1",
            "--head-dim",
            "8",
            "--min-runs",
            "1",
            "--min-time",
            "0",
        ],
        strs(&sdpa_args),
    ];
    for args in cases {
        // sdpa's output is a file, named as its flag gave it.
        let named = if args[0] == "sdpa" {
            "/dev/stdout"
        } else {
            "standard output"
        };
        let child = attend_cmd(&args, &dir)
            .stdout(OpenOptions::new().write(true).open("/dev/full").unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (code, _, err) = finish(child, &format!("{args:?}"));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_one_line(&err, &[named, "No space left on device"]);
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// `attend embed --output FILE SENTENCE…` writes the sentences' vectors to the
/// file (it used to print them and ignore --output): the same numbers as printed.
#[test]
fn embed_writes_sentences_to_output() {
    let dir = scratch("sentences");
    let (code, out, err, _) = attend(
        &["embed", "--output", "x.npy", "hello there", "good night"],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    let written = attend::io::npy::read_f32(dir.join("x.npy")).unwrap();
    let (code, out, err, _) = attend(&["embed", "hello there", "good night"], &dir);
    assert_eq!(code, 0, "{err}");
    let printed: Vec<Vec<f32>> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(written.shape(), &[2, printed[0].len()]);
    let written: Vec<f32> = written.iter().copied().collect();
    assert_eq!(written, printed.concat());
    fs::remove_dir_all(&dir).unwrap();
}

/// Without HOME the default model directory is not looked for relative to the
/// working directory (where a `.cache/attend/all-minilm-l6-v2` would have been
/// loaded): the error names --model and ATTEND_MODEL_DIR.
#[test]
fn without_home_the_model_must_be_named() {
    let dir = scratch("nohome");
    fs::create_dir_all(dir.join(".cache/attend")).unwrap();
    std::os::unix::fs::symlink(
        common::model_dir(),
        dir.join(".cache/attend/all-minilm-l6-v2"),
    )
    .unwrap();
    let child = attend_cmd(&["embed", "hello"], &dir)
        .env_remove("HOME")
        .env_remove("ATTEND_MODEL_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, _, err) = finish(child, "embed without HOME");
    assert_eq!(code, 2, "{err}");
    assert_one_line(&err, &["--model", "ATTEND_MODEL_DIR", "HOME"]);
    fs::remove_dir_all(&dir).unwrap();
}

/// A 10 MB line is cut to what the model reads before it is tokenised, with a
/// warning, in a bounded address space (it used to take 2 GB: every token of the
/// line was held); its vector is the one of any text with the same first tokens.
#[test]
fn a_huge_line_is_cut_with_a_warning_in_bounded_memory() {
    let dir = scratch("hugeline");
    fs::write(dir.join("huge.txt"), "word ".repeat(2_000_000) + "\n").unwrap();
    fs::write(dir.join("short.txt"), "word ".repeat(600) + "\n").unwrap();
    let child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1200000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_attend"))
        .args(["embed", "--input", "huge.txt", "--output", "huge.npy"])
        .current_dir(&dir)
        .env("ATTEND_MODEL_DIR", common::model_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, _, err) = finish(child, "a 10 MB line");
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(
        err.contains("1 line(s) were cut") && err.contains("line 1"),
        "{err}"
    );
    assert!(err.contains("truncated"), "{err}");
    let (code, _, err, _) = attend(
        &["embed", "--input", "short.txt", "--output", "short.npy"],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    let read = |f: &str| attend::io::npy::read_f32(dir.join(f)).unwrap();
    assert_eq!(read("huge.npy"), read("short.npy"));
    fs::remove_dir_all(&dir).unwrap();
}
