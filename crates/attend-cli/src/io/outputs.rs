//! The files a command writes, made all-or-nothing.
//!
//! Each output is written to a temporary file in its own directory (so the final
//! rename stays on one file system and is atomic) and renamed into place only by
//! [`Outputs::commit`], once the whole command has succeeded. A command that fails
//! part-way leaves no new or half-written file and clobbers no existing one: the
//! temporary files are removed when [`Outputs`] is dropped uncommitted. Two flags
//! naming the same file are refused before anything runs.

use std::path::{Path, PathBuf};

use attend::Error;

/// One output: the flag that named it, where it goes, where it is written first.
struct Output {
    flag: &'static str,
    target: PathBuf,
    temp: PathBuf,
}

/// A command's output files, pending until [`commit`](Self::commit).
pub struct Outputs {
    files: Vec<Output>,
}

impl Outputs {
    /// Plans the outputs named by `(flag, path)` pairs (absent ones skipped),
    /// refusing two flags that name the same file.
    pub fn new(requested: &[(&'static str, Option<&Path>)]) -> Result<Self, Error> {
        let mut files: Vec<Output> = Vec::new();
        for (i, &(flag, path)) in requested.iter().enumerate() {
            let Some(target) = path else { continue };
            let key = identity(target);
            if let Some(other) = files.iter().find(|o| identity(&o.target) == key) {
                return Err(Error::value(format!(
                    "{flag} and {} both name {}: each output needs its own file",
                    other.flag,
                    target.display()
                )));
            }
            let name = target
                .file_name()
                .ok_or_else(|| Error::io(target, format!("{flag} does not name a file")))?;
            // Refused now rather than after the work: the file could not be made.
            if !key.0.is_dir() {
                return Err(Error::io(
                    target,
                    format!("{flag}: the directory {} does not exist", key.0.display()),
                ));
            }
            // The temporary name ends in the target's own name, so that writers
            // that choose a format by extension (.svg, .png) see the right one.
            let temp = target.with_file_name(format!(
                ".attend-{}-{i}-{}",
                std::process::id(),
                name.to_string_lossy()
            ));
            files.push(Output {
                flag,
                target: target.to_path_buf(),
                temp,
            });
        }
        Ok(Outputs { files })
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

    /// Moves every written output into place.
    pub fn commit(mut self) -> Result<(), Error> {
        for o in std::mem::take(&mut self.files) {
            std::fs::rename(&o.temp, &o.target).map_err(|e| Error::io(&o.target, e))?;
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
        }
    }
}

/// What decides whether two paths are one file: the canonical directory (when it
/// exists) and the file name, so `a.npy` and `./a.npy` collide.
fn identity(path: &Path) -> (PathBuf, Option<std::ffi::OsString>) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    (
        dir.canonicalize().unwrap_or(dir),
        path.file_name().map(|n| n.to_os_string()),
    )
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
}
