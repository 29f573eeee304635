//! Runs one seed of the simulator and prints its report or its breach.
fn main() {
    let seed: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    match tessera_sim::run(seed, &tessera_sim::SimConfig::default()) {
        Ok(r) => println!("ok {r:?}"),
        Err(v) => println!("{v}"),
    }
}
