//! The `.npy` header: a Python dict literal, read as `numpy.load` reads it
//! (`ast.literal_eval`, then exactly the keys `descr`, `fortran_order`, `shape`).
//!
//! Keys and strings may be quoted with `'` or `"`; the shape is a tuple of
//! non-negative integers, `()` for a scalar and `(n,)` for one axis. What Python
//! would not evaluate to such a dict (`(1,, 2)`, `(3)`, a missing or extra key) is
//! refused with the reason.

/// The three fields of a header.
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    /// The dtype string, e.g. `<f4`.
    pub descr: String,
    /// Column-major data.
    pub fortran: bool,
    /// The array's shape.
    pub shape: Vec<usize>,
}

/// One value of the dict.
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
}

/// Parses the header text (trailing spaces and newline included).
pub(super) fn parse(text: &str) -> Result<Header, String> {
    let mut p = Parser {
        rest: text.trim_start(),
    };
    p.expect('{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        if p.eat('}') {
            break;
        }
        let key = p.string()?;
        p.expect(':')?;
        let value = p.value()?;
        match (key.as_str(), value) {
            ("descr", Value::Str(s)) => descr = Some(s),
            ("fortran_order", Value::Bool(b)) => fortran = Some(b),
            ("shape", Value::Tuple(t)) => shape = Some(t),
            ("descr" | "fortran_order" | "shape", _) => {
                return Err(format!("header key {key:?} has a value of the wrong type"))
            }
            // Debug-quoted: a key is file content and may hold a newline.
            _ => return Err(format!("header has an unexpected key {key:?}")),
        }
        if !p.eat(',') {
            p.expect('}')?;
            break;
        }
    }
    if !p.rest.trim().is_empty() {
        return Err("header has text after its closing '}'".into());
    }
    Ok(Header {
        descr: descr.ok_or("header has no 'descr'")?,
        fortran: fortran.ok_or("header has no 'fortran_order'")?,
        shape: shape.ok_or("header has no 'shape'")?,
    })
}

struct Parser<'a> {
    rest: &'a str,
}

impl Parser<'_> {
    /// Consumes `c` (after any spaces) if it comes next.
    fn eat(&mut self, c: char) -> bool {
        let r = self.rest.trim_start();
        match r.strip_prefix(c) {
            Some(after) => {
                self.rest = after;
                true
            }
            None => false,
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "bad header: expected '{c}' at {:?}",
                self.excerpt()
            ))
        }
    }

    fn excerpt(&self) -> String {
        self.rest.trim_start().chars().take(16).collect()
    }

    /// A string quoted with `'` or `"` (no escapes: none of the three fields
    /// needs one).
    fn string(&mut self) -> Result<String, String> {
        let r = self.rest.trim_start();
        let quote = r
            .chars()
            .next()
            .filter(|&q| q == '\'' || q == '"')
            .ok_or_else(|| format!("bad header: expected a quoted key at {:?}", self.excerpt()))?;
        let body = &r[1..];
        let end = body
            .find(quote)
            .ok_or("bad header: a string is not closed")?;
        if body[..end].contains('\\') {
            return Err("bad header: escapes in strings are not supported".into());
        }
        self.rest = &body[end + 1..];
        Ok(body[..end].to_string())
    }

    fn value(&mut self) -> Result<Value, String> {
        let r = self.rest.trim_start();
        if r.starts_with(['\'', '"']) {
            return self.string().map(Value::Str);
        }
        for (word, b) in [("True", true), ("False", false)] {
            if let Some(after) = r.strip_prefix(word) {
                self.rest = after;
                return Ok(Value::Bool(b));
            }
        }
        if r.starts_with('(') {
            return self.tuple().map(Value::Tuple);
        }
        Err(format!(
            "bad header: unexpected value at {:?}",
            self.excerpt()
        ))
    }

    /// `()`, `(n,)` or `(a, b, ...)` with an optional trailing comma; `(n)` is
    /// Python's integer `n`, not a tuple, and is refused as NumPy refuses it.
    fn tuple(&mut self) -> Result<Vec<usize>, String> {
        self.expect('(')?;
        let mut dims = Vec::new();
        let mut trailing_comma = false;
        while !self.eat(')') {
            dims.push(self.integer()?);
            trailing_comma = self.eat(',');
            if !trailing_comma {
                self.expect(')')?;
                break;
            }
        }
        if dims.len() == 1 && !trailing_comma {
            return Err(format!(
                "bad header: shape ({}) is an integer, not a tuple (write ({},))",
                dims[0], dims[0]
            ));
        }
        Ok(dims)
    }

    fn integer(&mut self) -> Result<usize, String> {
        let r = self.rest.trim_start();
        let len = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        if len == 0 {
            return Err(format!(
                "bad header: expected a non-negative integer in the shape at {:?}",
                self.excerpt()
            ));
        }
        let n = r[..len]
            .parse()
            .map_err(|_| format!("bad header: shape dimension {} is too large", &r[..len]))?;
        self.rest = &r[len..];
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(h: &str) -> Result<Vec<usize>, String> {
        parse(h).map(|h| h.shape)
    }

    #[test]
    fn reads_what_numpy_writes_in_either_quote() {
        let h = parse("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }    \n").unwrap();
        assert_eq!(
            h,
            Header {
                descr: "<f4".into(),
                fortran: false,
                shape: vec![2, 3]
            }
        );
        let h = parse(r#"{"descr": "|b1", "fortran_order": True, "shape": (4,)}"#).unwrap();
        assert!(h.fortran);
        assert_eq!(h.shape, vec![4]);
        assert_eq!(
            shape("{'shape': (), 'descr': '<f4', 'fortran_order': False}"),
            Ok(vec![])
        );
        assert_eq!(
            shape("{'descr':'<f4','fortran_order':False,'shape':(1,2,)}"),
            Ok(vec![1, 2])
        );
    }

    #[test]
    fn refuses_what_python_would_not_evaluate_to_such_a_dict() {
        let base =
            |shape: &str| format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        for bad in [
            "(1,, 2, 4, 8)",
            "(3)",
            "(,)",
            "(-1,)",
            "(1 2)",
            "(2, 3",
            "[2, 3]",
        ] {
            assert!(shape(&base(bad)).is_err(), "{bad}");
        }
        assert!(shape(&base("(99999999999999999999999,)")).is_err());
        for bad in [
            "{'descr': '<f4', 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x",
            "{'descr': '<f4\\'', 'fortran_order': False, 'shape': (2,)}",
            "{descr: '<f4'}",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
