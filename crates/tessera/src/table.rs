//! Aligned text tables for the CLI's human output.
//!
//! Owns: column widths and padding. Must not touch: what the cells say.
//! Invariant: every row has as many cells as the header (short rows are
//! padded with empty cells), cells are left-aligned, columns are separated
//! by two spaces, and no line ends in spaces.

/// A table being built row by row.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Spaces between columns.
const GAP: usize = 2;

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing trailing cells are empty, extra cells dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// True when no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as lines of text, header first, each ending in a newline.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str(&" ".repeat(GAP));
                }
                line.push_str(cell);
                line.push_str(&" ".repeat(w - cell.chars().count()));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn columns_line_up_under_their_titles() {
        let mut t = Table::new(&["NAME", "SIZE"]);
        t.row(vec!["vol1".into(), "10.0 GiB".into()]);
        t.row(vec!["a-longer-name".into(), "4.0 KiB".into()]);
        assert_eq!(
            t.render(),
            "NAME           SIZE\n\
             vol1           10.0 GiB\n\
             a-longer-name  4.0 KiB\n"
        );
    }

    #[test]
    fn short_rows_are_padded_and_lines_have_no_trailing_spaces() {
        let mut t = Table::new(&["A", "B", "C"]);
        t.row(vec!["x".into()]);
        assert_eq!(t.render(), "A  B  C\nx\n");
    }

    proptest! {
        #[test]
        fn every_column_starts_at_the_same_place_on_every_line(
            rows in proptest::collection::vec(
                proptest::collection::vec("[a-z0-9]{1,12}", 3), 1..8)
        ) {
            let mut t = Table::new(&["ONE", "TWO", "THREE"]);
            for r in &rows {
                t.row(r.clone());
            }
            let text = t.render();
            let lines: Vec<&str> = text.lines().collect();
            prop_assert_eq!(lines.len(), rows.len() + 1);
            let start_of_third = lines[0].find("THREE").expect("title");
            for (line, row) in lines[1..].iter().zip(&rows) {
                prop_assert_eq!(&line[start_of_third..], row[2].as_str());
            }
        }
    }
}
