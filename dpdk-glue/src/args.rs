//! EAL arguments from one string, split the way a POSIX shell splits words.

use crate::error::{Error, Result};

/// Splits `s` into words like a shell: blanks separate words; `'…'` keeps everything
/// literally; `"…"` keeps everything but `\"`, `\\`, `\$` and `` \` `` (which drop the
/// backslash); outside quotes a backslash keeps the next character. No expansion of any kind.
/// An unterminated quote or a trailing backslash is an error.
pub fn split_args(s: &str) -> Result<Vec<String>> {
    let err = |m: &str| Error::other("rte_eal_init", format!("EAL arguments `{s}`: {m}"));
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(err("unterminated ' quote")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => cur.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                cur.push('\\');
                                cur.push(c);
                            }
                            None => return Err(err("unterminated \" quote")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(err("unterminated \" quote")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') => {}
                    Some(c) => cur.push(c),
                    None => return Err(err("trailing backslash")),
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::split_args;

    fn split(s: &str) -> Vec<String> {
        split_args(s).unwrap()
    }

    #[test]
    fn blanks_separate_words() {
        assert_eq!(
            split("  -l 0  --no-huge\t-m 256\n"),
            ["-l", "0", "--no-huge", "-m", "256"]
        );
        assert!(split("").is_empty());
        assert!(split("   ").is_empty());
    }

    #[test]
    fn quotes_keep_blanks_and_join_words() {
        assert_eq!(
            split(r#"--vdev='net_pcap0,iface=a b' "--file-prefix=x y"z"#),
            ["--vdev=net_pcap0,iface=a b", "--file-prefix=x yz"]
        );
        assert_eq!(split(r#"'' """#), ["", ""]);
        assert_eq!(split(r#"'a"b' "c'd""#), [r#"a"b"#, "c'd"]);
    }

    #[test]
    fn backslashes() {
        assert_eq!(split(r"a\ b \'c"), ["a b", "'c"]);
        assert_eq!(split(r#""\"\\\$\`\n""#), [r#""\$`\n"#]);
        assert_eq!(split(r"'\n'"), [r"\n"]);
    }

    #[test]
    fn unterminated_quotes_are_errors() {
        for s in ["'abc", "\"abc", "abc\\", "\"a\\\""] {
            let e = split_args(s).unwrap_err();
            assert_eq!(e.function(), "rte_eal_init");
            assert!(e.to_string().contains("unterminated") || e.to_string().contains("trailing"));
        }
    }
}
