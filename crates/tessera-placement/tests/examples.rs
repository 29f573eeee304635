//! The worked examples of docs/PLACEMENT.md, checked: if placement changes
//! its choices, the documentation changes with it.

mod common;

use common::*;
use tessera_placement::{check_layout, place, ClusterMap};

fn layout_of(map: &ClusterMap, ftt: u8, width: u8) -> String {
    let layout = place(
        &policy(ftt, width, 0),
        &volume("vm1"),
        10 * GIB,
        map,
        &mut ids(),
    )
    .unwrap();
    check_layout(&layout, ftt).unwrap();
    render(&layout)
}

#[test]
fn print_examples() {
    println!("{}\n", layout_of(&hosts(3, 100 * GIB), 1, 1));
    println!("{}\n", layout_of(&hosts(4, 100 * GIB), 1, 1));
    println!("{}\n", layout_of(&hosts(4, 100 * GIB), 1, 2));
    println!("{}\n", layout_of(&hosts(3, 100 * GIB), 1, 2));
    println!("{}\n", layout_of(&hosts(5, 100 * GIB), 2, 1));
    println!("{}\n", layout_of(&hosts(7, 100 * GIB), 3, 1));
    println!("{}\n", layout_of(&hosts(3, 100 * GIB), 1, 12));
}
