//! Every shipped scenario file parses and validates, and names its own file.

use std::path::Path;

use simulations::Scenario;

#[test]
fn every_shipped_scenario_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("scenarios/ exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let sc = Scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert_eq!(
                Some(sc.name.as_str()),
                path.file_stem().and_then(|s| s.to_str()),
                "a scenario's name is its file name, so its report lands in target/sim/<file>/"
            );
            names.push(sc.name);
        }
    }
    names.sort();
    assert_eq!(
        names,
        [
            "bursty",
            "bursty-fleet",
            "even-fleet",
            "far-store",
            "fixed-window",
            "fleet-start",
            "fleet-start-on-demand",
            "hot-node",
            "low-rate",
            "mixed-fleet",
            "moving-hotspot",
            "moving-hotspot-fleet",
            "node-crash",
            "rolling-restart",
            "scale-out-in",
            "skewed",
            "skewed-small-burst",
            "sparse-tight-fleet",
            "store-outage",
            "tight-burst",
            "tight-burst-fleet",
            "tiny-burst",
            "uniform"
        ]
    );
}
