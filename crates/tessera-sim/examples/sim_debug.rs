//! Runs one seed of a simulator and prints its report or its breach:
//! `sim_debug SEED` for the control plane, `sim_debug SEED data` for the
//! data path.
fn main() {
    let seed: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    if std::env::args().nth(2).as_deref() == Some("data") {
        let config = tessera_sim::data_path::DataPathConfig::default();
        match tessera_sim::data_path::run_data_path(seed, &config) {
            Ok(r) => println!("ok {r:?}"),
            Err(v) => println!("{v}"),
        }
        return;
    }
    match tessera_sim::run(seed, &tessera_sim::SimConfig::default()) {
        Ok(r) => println!("ok {r:?}"),
        Err(v) => println!("{v}"),
    }
}
