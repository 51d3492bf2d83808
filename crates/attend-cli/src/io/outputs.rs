//! The files a command writes: all or nothing, and never a replaced special file.
//!
//! Every target is looked at when the command starts, before any work, following
//! symbolic links to what they name (the link stays a link; its target is written):
//!
//! - absent, or a regular file the user may write: the output is written to a
//!   temporary file beside it (one file system, so the final rename is atomic) and
//!   renamed over it by [`Outputs::commit`] once the whole command has succeeded;
//!   a replaced file keeps its permissions;
//! - a character device (`/dev/null`, `/dev/full`, a terminal), a FIFO, or a name
//!   of the standard streams (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
//!   `/proc/self/fd/N`): written through. The output goes to a temporary file in
//!   the system's temporary directory first (the `.npy` writers seek back to their
//!   header) and is copied into the target by `commit`; the target stays what it
//!   is, and a failed command sends nothing to it;
//! - a directory, a block device, a socket or a read-only file: refused with a
//!   one-line error.
//!
//! A command that fails part-way leaves no new or half-written file and clobbers no
//! existing one: the temporary files are created (so an unwritable directory is
//! refused) and registered with [`cleanup`] before any work, removed when
//! [`Outputs`] is dropped uncommitted, and removed by `cleanup` on SIGINT, SIGTERM
//! or SIGHUP. Two flags naming the same regular file are refused.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use attend::Error;

use super::cleanup;

/// Symbolic links followed at most, as the kernel's own limit (ELOOP).
const MAX_LINKS: usize = 40;

/// How an output reaches its target.
#[derive(PartialEq)]
enum Delivery {
    /// Renamed over the regular file (or the absent one) at this resolved path.
    Rename(PathBuf),
    /// Copied into the device, FIFO or stream at the target.
    Through,
}

/// One output: the flag that named it, where it goes, where it is written first.
struct Output {
    flag: &'static str,
    target: PathBuf,
    temp: PathBuf,
    delivery: Delivery,
    /// Whether [`Outputs::write`] wrote it: the empty temporary file made up
    /// front must never replace a target.
    written: Cell<bool>,
}

/// A command's output files, pending until [`commit`](Self::commit).
pub struct Outputs {
    files: Vec<Output>,
}

impl Outputs {
    /// Plans the outputs named by `(flag, path)` pairs (absent ones skipped) and
    /// creates their temporary files, refusing a target that cannot be written
    /// or two flags that name the same file.
    pub fn new(requested: &[(&'static str, Option<&Path>)]) -> Result<Self, Error> {
        // Built in place, so that an error part-way drops the files made so far.
        let mut outputs = Outputs { files: Vec::new() };
        for (i, &(flag, path)) in requested.iter().enumerate() {
            let Some(target) = path else { continue };
            let name = target
                .file_name()
                .ok_or_else(|| Error::io(target, format!("{flag} does not name a file")))?;
            let delivery = delivery(flag, target)?;
            let dir = match &delivery {
                Delivery::Rename(resolved) => {
                    if let Some(other) = outputs.files.iter().find(|o| o.delivery == delivery) {
                        return Err(Error::value(format!(
                            "{flag} and {} both name {}: each output needs its own file",
                            other.flag,
                            target.display()
                        )));
                    }
                    resolved.parent().map(Path::to_path_buf).unwrap_or_default()
                }
                Delivery::Through => std::env::temp_dir(),
            };
            // The temporary name ends in the target's own name, so that writers
            // that choose a format by extension (.svg, .png) see the right one.
            let temp = dir.join(format!(
                ".attend-{}-{i}-{}",
                std::process::id(),
                name.to_string_lossy()
            ));
            cleanup::register(&temp)?;
            outputs.files.push(Output {
                flag,
                target: target.to_path_buf(),
                temp: temp.clone(),
                delivery,
                written: Cell::new(false),
            });
            File::create(&temp).map_err(|e| {
                Error::io(
                    target,
                    format!("{flag}: cannot create {}: {e}", temp.display()),
                )
            })?;
        }
        Ok(outputs)
    }

    /// Writes the output named by `flag`, if it was requested, with `write` given
    /// the temporary path; an error names the output's own path, not the
    /// temporary one.
    pub fn write(
        &self,
        flag: &str,
        write: impl FnOnce(&Path) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let Some(o) = self.files.iter().find(|o| o.flag == flag) else {
            return Ok(());
        };
        let (temp, target) = (o.temp.display().to_string(), o.target.display().to_string());
        let named = |m: String| m.replace(&temp, &target);
        o.written.set(true);
        write(&o.temp).map_err(|e| match e {
            Error::Io { path, source } if path == o.temp => Error::Io {
                path: o.target.clone(),
                source,
            },
            Error::ShapeMismatch(m) => Error::ShapeMismatch(named(m)),
            Error::Value(m) => Error::Value(named(m)),
            Error::Format(m) => Error::Format(named(m)),
            Error::Io { .. }
            | Error::Shape { .. }
            | Error::IsaUnavailable(_)
            | Error::Unsupported { .. } => e,
        })
    }

    /// Moves every written output into place: renamed over a regular file (synced
    /// to disk first, so that the rename publishes a complete file), copied into
    /// a device, FIFO or stream. An output never written is left as it was.
    pub fn commit(mut self) -> Result<(), Error> {
        for o in std::mem::take(&mut self.files) {
            let delivered = match &o.delivery {
                _ if !o.written.get() => Ok(()),
                Delivery::Rename(resolved) => rename(&o.temp, resolved),
                Delivery::Through => copy(&o.temp, &o.target),
            };
            let _ = std::fs::remove_file(&o.temp);
            cleanup::forget(&o.temp);
            delivered.map_err(|e| Error::io(&o.target, e))?;
        }
        Ok(())
    }
}

impl Drop for Outputs {
    /// An uncommitted command failed: its temporary files go, the targets stay
    /// as they were.
    fn drop(&mut self) {
        for o in &self.files {
            let _ = std::fs::remove_file(&o.temp);
            cleanup::forget(&o.temp);
        }
    }
}

/// How `target` is written, or why it cannot be.
fn delivery(flag: &str, target: &Path) -> Result<Delivery, Error> {
    if names_a_stream(target) {
        return Ok(Delivery::Through);
    }
    let resolved = resolve(flag, target)?;
    let meta = match std::fs::metadata(&resolved) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Delivery::Rename(resolved))
        }
        Err(e) => return Err(Error::io(target, e)),
    };
    let kind = meta.file_type();
    let refuse = |what: String| Error::value(format!("{flag} {}: {what}", target.display()));
    if kind.is_file() {
        if meta.permissions().readonly() {
            return Err(refuse(format!(
                "is read-only (mode {:o}): attend replaces only a file its owner may write",
                meta.permissions().mode() & 0o7777
            )));
        }
        // Opening without truncating asks the kernel whether this user may write it.
        OpenOptions::new()
            .write(true)
            .open(&resolved)
            .map_err(|e| refuse(format!("cannot be written: {e}")))?;
        return Ok(Delivery::Rename(resolved));
    }
    if kind.is_char_device() || kind.is_fifo() {
        return Ok(Delivery::Through);
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(refuse(format!(
        "is {what}: attend writes a file, a FIFO or a character device such as /dev/null"
    )))
}

/// `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` and `/proc/self/fd/N` name whatever
/// the shell connected, a redirected regular file included: written through, so
/// that the shell's file is the one that receives the output.
fn names_a_stream(path: &Path) -> bool {
    path == Path::new("/dev/stdout")
        || path == Path::new("/dev/stderr")
        || path.parent() == Some(Path::new("/dev/fd"))
        || path.parent() == Some(Path::new("/proc/self/fd"))
}

/// `path` with its symbolic links followed to the file they name (which may not
/// exist yet), in its directory's canonical form.
fn resolve(flag: &str, path: &Path) -> Result<PathBuf, Error> {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let is_link = std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            let name = at
                .file_name()
                .ok_or_else(|| Error::io(path, format!("{flag} does not name a file")))?;
            let dir = match at.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            // Refused now rather than after the work: the file could not be made.
            let dir = dir.canonicalize().map_err(|_| {
                Error::io(
                    path,
                    format!("{flag}: the directory {} does not exist", dir.display()),
                )
            })?;
            return Ok(dir.join(name));
        }
        let link = std::fs::read_link(&at).map_err(|e| Error::io(path, e))?;
        // A relative link is relative to the directory holding it.
        at = match at.parent() {
            Some(dir) => dir.join(link),
            None => link,
        };
    }
    Err(Error::io(
        path,
        format!("{flag}: more than {MAX_LINKS} symbolic links to follow"),
    ))
}

/// Renames `temp` over `resolved`, synced first, with the permissions of the file
/// it replaces.
fn rename(temp: &Path, resolved: &Path) -> std::io::Result<()> {
    File::open(temp)?.sync_all()?;
    if let Ok(old) = std::fs::metadata(resolved) {
        std::fs::set_permissions(temp, old.permissions())?;
    }
    std::fs::rename(temp, resolved)
}

/// Copies `temp` into the device, FIFO or stream at `target`.
fn copy(temp: &Path, target: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut from = File::open(temp)?;
    // The process's own streams are written through their descriptors, so that
    // a `>>` redirection appends and the shared offset moves.
    let mut to: Box<dyn Write> = if target == Path::new("/dev/stdout") {
        Box::new(std::io::stdout().lock())
    } else if target == Path::new("/dev/stderr") {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(OpenOptions::new().write(true).open(target)?)
    };
    std::io::copy(&mut from, &mut to)?;
    to.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("attend-outputs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_same_file_twice_is_refused() {
        let dir = scratch("same");
        let a = dir.join("x.npy");
        let b = dir.join(".").join("x.npy");
        let err = Outputs::new(&[("--dq", Some(&a)), ("--out", Some(&b))])
            .err()
            .expect("refused")
            .to_string();
        assert_eq!(
            err,
            format!(
                "--out and --dq both name {}: each output needs its own file",
                b.display()
            )
        );
        let missing = dir.join("no-such-dir").join("x.npy");
        let err = Outputs::new(&[("--out", Some(&missing))])
            .err()
            .expect("refused");
        assert!(err.to_string().contains("--out: the directory"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_lands_until_commit_and_a_failure_leaves_the_old_file() {
        let dir = scratch("commit");
        let (a, b) = (dir.join("a.svg"), dir.join("b.txt"));
        std::fs::write(&b, "old").unwrap();
        let outputs = Outputs::new(&[("--a", Some(&a)), ("--b", Some(&b)), ("--c", None)]).unwrap();
        let mut temp = None;
        let write = |text: &'static str| {
            move |p: &Path| std::fs::write(p, text).map_err(|e| Error::io(p, e))
        };
        outputs
            .write("--a", |p| {
                temp = Some(p.to_path_buf());
                write("new a")(p)
            })
            .unwrap();
        let temp = temp.unwrap();
        assert!(temp.to_string_lossy().ends_with("a.svg") && temp.exists());
        outputs.write("--b", write("new b")).unwrap();
        outputs
            .write("--c", |_| panic!("--c was not requested"))
            .unwrap();
        drop(outputs); // the command failed
        assert!(!a.exists() && !temp.exists());
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "old");

        let outputs = Outputs::new(&[("--a", Some(&a)), ("--b", Some(&b))]).unwrap();
        outputs.write("--a", write("new a")).unwrap();
        outputs.write("--b", write("new b")).unwrap();
        outputs.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "new a");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "new b");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_output_never_written_leaves_its_target() {
        let dir = scratch("unwritten");
        let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
        std::fs::write(&a, "old").unwrap();
        let outputs = Outputs::new(&[("--a", Some(&a)), ("--b", Some(&b))]).unwrap();
        outputs.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old");
        assert!(!b.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
