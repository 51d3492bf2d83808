//! Text inside HTML, SVG and XML: the one escaping function of the pages and
//! pictures.

/// `s` as markup text or a quoted attribute value: `&`, `<`, `>` and `"` as
/// entities, and control characters (which XML 1.0 forbids and a title cannot show)
/// as spaces.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_characters_become_entities_and_controls_spaces() {
        assert_eq!(
            escape("a<b & \"c\">\u{7}\nd é"),
            "a&lt;b &amp; &quot;c&quot;&gt;  d é"
        );
    }
}
