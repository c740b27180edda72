//! CPython's line tables: the line a code object's instruction belongs to, decoded from the
//! object's `co_linetable` bytes without the interpreter — the 3.10 format (pairs of byte deltas)
//! and the 3.11+ location table (one entry per run of code units). Pure functions over bytes, so
//! the sampler can call them inside `malloc`; tested against `co_lines()`/`co_positions()` of the
//! real interpreters (tests/tests/python_frames.rs).

/// The line of the instruction at byte offset `offset` in a 3.10 code object whose line table is
/// `table` and first line `first`; `None` where the table gives no line (or ends before it).
///
/// The table is a sequence of `(start delta, line delta)` byte pairs; a line delta of -128 marks
/// a range without a line (CPython 3.10's `Objects/lnotab_notes.txt`).
pub fn line_310(table: &[u8], first: i32, offset: u32) -> Option<u32> {
    let mut line = first;
    let mut end: u32 = 0;
    for pair in table.chunks_exact(2) {
        let (sdelta, ldelta) = (u32::from(pair[0]), pair[1] as i8);
        let start = end;
        end = start.saturating_add(sdelta);
        if ldelta != -128 {
            line = line.saturating_add(i32::from(ldelta));
        }
        if offset >= start && offset < end {
            return (ldelta != -128 && line > 0).then_some(line as u32);
        }
    }
    None
}

/// The line of the instruction at code-unit index `index` in a 3.11+ code object whose location
/// table is `table` and first line `first`; `None` where the table gives no line.
///
/// Each entry starts with a byte `1cccclll`: code `cccc`, and `lll + 1` code units covered.
/// Code 15: no location; 14: long form (signed varint line delta, then end line, columns as
/// varints); 13: no columns (signed varint line delta); 10–12: one line, delta `code − 10` (two
/// column bytes follow); 0–9: short form, same line (one column byte follows). CPython's
/// `InternalDocs/locations.md` (3.11: `Objects/locations.md`).
pub fn line_311(table: &[u8], first: i32, index: u32) -> Option<u32> {
    let mut line = first;
    let mut at: u32 = 0;
    let mut i = 0usize;
    while i < table.len() {
        let head = table[i];
        i += 1;
        if head & 0x80 == 0 {
            return None; // Not the start of an entry: a table this reader does not know.
        }
        let code = (head >> 3) & 15;
        let units = u32::from(head & 7) + 1;
        let known = match code {
            15 => false,
            14 => {
                line = line.saturating_add(signed_varint(table, &mut i)?);
                for _ in 0..3 {
                    varint(table, &mut i)?;
                }
                true
            }
            13 => {
                line = line.saturating_add(signed_varint(table, &mut i)?);
                true
            }
            10..=12 => {
                line = line.saturating_add(i32::from(code) - 10);
                i += 2;
                true
            }
            _ => {
                i += 1;
                true
            }
        };
        let end = at.saturating_add(units);
        if index >= at && index < end {
            return (known && line > 0).then_some(line as u32);
        }
        at = end;
    }
    None
}

/// A varint of the location table: 6-bit groups, least significant first, bit 6 set on all but
/// the last.
fn varint(table: &[u8], i: &mut usize) -> Option<u32> {
    let mut value: u32 = 0;
    let mut shift = 0u32;
    loop {
        let b = *table.get(*i)?;
        *i += 1;
        value |= u32::from(b & 63).checked_shl(shift)?;
        if b & 64 == 0 {
            return Some(value);
        }
        shift += 6;
        if shift > 30 {
            return None;
        }
    }
}

/// A signed varint: the sign in the lowest bit.
fn signed_varint(table: &[u8], i: &mut usize) -> Option<i32> {
    let v = varint(table, i)?;
    let magnitude = (v >> 1) as i32;
    Some(if v & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_310_table_maps_offsets_to_lines() {
        // Offsets 0..6 on line 10, 6..10 on 11, 10..14 without a line, 14..20 on 13.
        let table = [6u8, 0, 4, 1, 4, 0x80, 6, 2];
        assert_eq!(line_310(&table, 10, 0), Some(10));
        assert_eq!(line_310(&table, 10, 5), Some(10));
        assert_eq!(line_310(&table, 10, 6), Some(11));
        assert_eq!(line_310(&table, 10, 12), None);
        assert_eq!(line_310(&table, 10, 14), Some(13));
        assert_eq!(line_310(&table, 10, 20), None);
    }

    #[test]
    fn a_311_table_reads_every_entry_form() {
        let table = [
            0x80 | (13 << 3) | 1, // no columns, 2 units, line +2 (varint 4)
            4,
            0x80 | (11 << 3), // one-line form, 1 unit, line +1
            0,
            5,
            0x80 | (3 << 3) | 2, // short form, 3 units, same line
            7,
            0x80 | (15 << 3), // no location, 1 unit
            0x80 | (14 << 3), // long form, 1 unit, line -3 (varint 7), end line, columns
            7,
            0,
            1,
            2,
        ];
        assert_eq!(line_311(&table, 100, 0), Some(102));
        assert_eq!(line_311(&table, 100, 1), Some(102));
        assert_eq!(line_311(&table, 100, 2), Some(103));
        assert_eq!(line_311(&table, 100, 5), Some(103));
        assert_eq!(line_311(&table, 100, 6), None);
        assert_eq!(line_311(&table, 100, 7), Some(100));
        assert_eq!(line_311(&table, 100, 8), None);
    }

    #[test]
    fn truncated_or_foreign_tables_give_no_line() {
        assert_eq!(line_311(&[0x80 | (13 << 3)], 1, 0), None);
        assert_eq!(line_311(&[0x05], 1, 0), None);
        assert_eq!(line_310(&[3], 1, 0), None);
    }
}
