//! The aligned text tables `audit` and `explain` print: columns padded to
//! their widest cell, two spaces apart, no trailing blanks.

/// One line per row, each ending in a newline. Every row has as many cells
/// as the first (the header).
pub fn aligned<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.first().map_or(0, |r| r.as_ref().len());
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .map(|row| row.as_ref().get(i).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .as_ref()
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_pad_to_the_widest_cell_and_lines_lose_trailing_blanks() {
        let rows = vec![
            ["KEY".to_string(), "VALUE".into(), String::new()],
            ["memory.high".into(), "1".into(), "DRIFT".into()],
            ["x".into(), "".into(), "".into()],
        ];
        assert_eq!(
            aligned(&rows),
            "KEY          VALUE\nmemory.high  1      DRIFT\nx\n"
        );
        assert_eq!(aligned::<[String; 0]>(&[]), "");
    }
}
