//! The report's recommendation: which of the modes run suits this scenario's traffic, by the
//! goals every mode is judged on, so a reader choosing settings need not weigh the table's
//! columns by hand.
//!
//! The rule, in order of what matters to someone running one limit for a fleet:
//!
//! 1. **The bound.** A mode that let any window exceed `burst + rate × W` is out.
//! 2. **A Redis the fleet can afford.** A mode whose calls keep Redis busy more than
//!    [`AFFORDABLE_CPU`] of a core for this one limit is out, unless every mode does: one limit
//!    that takes more crowds out whatever else the server serves (a thousand nodes leasing a
//!    tight burst five tokens at a time took 0.56 of a core for 1.4 points of utilization more
//!    than rate leases, at 0.05). A mode that makes no store calls (static shares) is always
//!    affordable, so "every mode" means every mode that calls the store. Nor is it out where
//!    the pick among the affordable modes admits more than [`PRICED_SLACK`] less than the pick
//!    among all, unless it keeps a whole core busy (calls then queue and time out): 0.54 of a
//!    core is worth a hot spot followed (moving-hotspot-fleet: 0.9970, against static shares'
//!    0.9164 that leave the hot node 1 % of its requests, and rate leases' 0.8634).
//! 3. **Fairness, then admission.** Of the rest, the fair ones (Jain's index at least
//!    [`FAIR_JAIN`], or within [`UTIL_SLACK`] of the fairest where none reaches it), and of
//!    those the ones within [`UTIL_SLACK`] of the best utilization among them — a point of
//!    utilization or fairness is worth more than any number of store calls a fleet can afford.
//! 4. **Cost.** Among those, the fewest store calls, since each call is Redis CPU and a round
//!    trip on some node — but calls within [`CALLS_SLACK`] of the fewest count as as few, and
//!    of those the best utilization wins: a dozen calls saved is no reason to admit less. On a
//!    tie, the mode listed first (the report lists the default before its variants).
//!
//! The answer is for the traffic simulated: a mode that wins on even demand (static shares,
//! say) can lose badly on skewed demand, so run the scenarios that look like your fleet.

/// How far below the best utilization (and, where no mode is fair, the best Jain's index) a
/// mode may be and still be recommended for fewer store calls: a point.
pub const UTIL_SLACK: f64 = 0.01;

/// Jain's index of per-node acceptance from which a mode counts as fair (the simulator's
/// fairness goal).
pub const FAIR_JAIN: f64 = 0.98;

/// Store calls up to this multiple of the fewest count as as few (a tenth more).
pub const CALLS_SLACK: f64 = 1.1;

/// The most Redis time, in cores over the run, a mode's calls for one limit may take and still
/// be recommended: half a core, the fleet-scale goal of this project — unless the affordable
/// modes' pick admits more than [`PRICED_SLACK`] less (see the module docs).
pub const AFFORDABLE_CPU: f64 = 0.5;

/// The most utilization the rule of [`AFFORDABLE_CPU`] may cost: two points, the goals' margin
/// for a mode never worse than pure mode. (At least [`UTIL_SLACK`]: a pick among all modes
/// that is itself affordable admits within that of the affordable modes' pick.)
pub const PRICED_SLACK: f64 = 0.02;

/// Redis time from which a mode is never recommended for what it admits (see the module
/// docs): a whole core, where calls queue and time out.
pub const SATURATED_CPU: f64 = 1.0;

/// What the rule reads of one mode's results.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// The mode's name.
    pub mode: &'a str,
    /// What the mode is in a service's code.
    pub in_code: &'a str,
    /// Admitted over what the limit allows.
    pub utilization: f64,
    /// Jain's index of per-node acceptance.
    pub jain: f64,
    /// Worst window's excess over `burst + rate × W`.
    pub overshoot: u64,
    /// Calls to the store.
    pub store_calls: u64,
    /// Cores of Redis time the calls took, over the run.
    pub redis_cpu: f64,
}

/// The mode to recommend among `modes`, and why: two lines (the mode, then the numbers and
/// the rule that chose it); none if no mode ran.
pub fn recommend(modes: &[Candidate<'_>]) -> Vec<String> {
    if modes.is_empty() {
        return Vec::new();
    }
    let bounded: Vec<&Candidate<'_>> = modes.iter().filter(|m| m.overshoot == 0).collect();
    if bounded.is_empty() {
        return vec!["recommended: none — every mode exceeded burst + rate × W".to_string()];
    }
    // Affordable, unless no mode that calls the store is (one that makes no calls, as static
    // shares, is always affordable, and must not win by that alone).
    let affordable: Vec<&Candidate<'_>> = bounded
        .iter()
        .copied()
        .filter(|m| m.redis_cpu <= AFFORDABLE_CPU)
        .collect();
    let unpriced = choose(&bounded);
    let priced = if affordable.iter().any(|m| m.store_calls > 0) {
        choose(&affordable)
    } else {
        None
    };
    // The affordable pick, unless it admits more than `PRICED_SLACK` less than one that does
    // not saturate Redis (then kept, to say so).
    let (choice, passed_over) = match (priced, unpriced) {
        (Some(priced), Some(unpriced))
            if unpriced.pick.utilization - priced.pick.utilization > PRICED_SLACK
                && unpriced.pick.redis_cpu > AFFORDABLE_CPU
                && unpriced.pick.redis_cpu < SATURATED_CPU =>
        {
            (Some(unpriced), Some(priced.pick))
        }
        (Some(priced), _) => (Some(priced), None),
        (None, unpriced) => (unpriced, None),
    };
    let Some(Choice { pick, best }) = choice else {
        return Vec::new();
    };
    let mut numbers = format!(
        "utilization {:.4}, Jain {:.4}, {} store calls",
        pick.utilization, pick.jain, pick.store_calls
    );
    if let Some(pure) = modes
        .iter()
        .find(|m| m.mode == "pure-redis" && m.store_calls > 0)
    {
        if pick.mode != pure.mode {
            numbers.push_str(&format!(
                " ({:.1} % of pure-redis's)",
                100.0 * pick.store_calls as f64 / pure.store_calls as f64
            ));
        }
    }
    let mut rule = if pick.mode == best.mode {
        "the best utilization of the fair modes, no overshoot".to_string()
    } else {
        format!(
            "the fewest store calls within {UTIL_SLACK} of the best utilization of the fair \
             modes ({:.4}, {}), no overshoot",
            best.utilization, best.mode
        )
    };
    // The mode the rule would pick without the cost of Redis, if another.
    if let Some(Choice { pick: costly, .. }) = unpriced.filter(|c| c.pick.mode != pick.mode) {
        rule.push_str(&format!(
            "; not {} ({:.4}): {:.2} core of Redis, above {AFFORDABLE_CPU}",
            costly.mode, costly.utilization, costly.redis_cpu
        ));
    }
    // The affordable modes' pick, if it was passed over for admitting too little.
    if let Some(cheap) = passed_over {
        rule.push_str(&format!(
            "; {:.2} core of Redis, above {AFFORDABLE_CPU}, kept: the affordable modes' pick \
             admits {:.4} ({}), more than {PRICED_SLACK} less",
            pick.redis_cpu, cheap.utilization, cheap.mode
        ));
    }
    let mut first = format!(
        "recommended for this traffic: {} ({})",
        pick.mode, pick.in_code
    );
    if pick.store_calls == 0 {
        first.push_str(" — only while demand stays this even: nothing lends a quiet node's part");
    }
    vec![first, format!("  {numbers}: {rule}")]
}

/// What [`choose`] chose: the mode, and the fair mode of best utilization it was measured
/// against.
#[derive(Clone, Copy)]
struct Choice<'a, 'b> {
    pick: &'b Candidate<'a>,
    best: &'b Candidate<'a>,
}

/// Rules 3 and 4 among `modes` (see the module docs); `None` if `modes` is empty.
fn choose<'a, 'b>(modes: &[&'b Candidate<'a>]) -> Option<Choice<'a, 'b>> {
    // The fair modes: Jain's index at least `FAIR_JAIN`, or, where none reaches it, within a
    // point of the fairest.
    let fairest = modes.iter().map(|m| m.jain).fold(f64::MIN, f64::max);
    let bar = if fairest >= FAIR_JAIN {
        FAIR_JAIN
    } else {
        fairest - UTIL_SLACK
    };
    let fair: Vec<&Candidate<'_>> = modes.iter().copied().filter(|m| m.jain >= bar).collect();
    let best = fair
        .iter()
        .copied()
        .max_by(|a, b| a.utilization.total_cmp(&b.utilization))?;
    let near: Vec<&Candidate<'_>> = fair
        .iter()
        .copied()
        .filter(|m| m.utilization >= best.utilization - UTIL_SLACK)
        .collect();
    let fewest = near.iter().map(|m| m.store_calls).min().unwrap_or(0);
    // On a tie, the mode that ran first (the report's order puts the simpler first: the
    // default before rate leases).
    let pick = near
        .iter()
        .copied()
        .filter(|m| m.store_calls as f64 <= fewest as f64 * CALLS_SLACK)
        .reduce(|a, b| if b.utilization > a.utilization { b } else { a })
        .unwrap_or(best);
    Some(Choice { pick, best })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(mode: &str, utilization: f64, jain: f64, overshoot: u64, calls: u64) -> Candidate<'_> {
        Candidate {
            mode,
            in_code: "code",
            utilization,
            jain,
            overshoot,
            store_calls: calls,
            redis_cpu: 0.0,
        }
    }

    /// Sets each mode's Redis time, in the order given.
    fn with_cpu(modes: &mut [Candidate<'_>], cpu: &[f64]) {
        for (mode, cpu) in modes.iter_mut().zip(cpu) {
            mode.redis_cpu = *cpu;
        }
    }

    fn picked(modes: &[Candidate<'_>]) -> String {
        let lines = recommend(modes);
        let first = lines.first().expect("a line");
        first
            .trim_start_matches("recommended for this traffic: ")
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    }

    #[test]
    fn the_fewest_calls_within_a_point_of_the_best_fair_and_bounded() {
        let modes = [
            m("pure-redis", 0.2828, 0.9130, 0, 1_481_868),
            m("hybrid", 0.9969, 0.9842, 0, 561_650),
            m("hybrid-rate", 0.9907, 0.9764, 0, 363_163),
            m("hybrid-fixed", 0.9984, 0.9955, 0, 824_882),
            m("static-share", 0.4106, 0.9370, 0, 0),
        ];
        // hybrid-rate has fewer calls but is not fair (0.9764 < 0.98); static-share none,
        // but admits 0.41.
        assert_eq!(picked(&modes), "hybrid");
        let why = &recommend(&modes)[1];
        assert!(why.contains("(37.9 % of pure-redis's)"), "{why}");
        assert!(why.contains("(0.9984, hybrid-fixed)"), "{why}");
        // Fair, it is the pick.
        let mut fair = modes;
        fair[2].jain = 0.9810;
        assert_eq!(picked(&fair), "hybrid-rate");
    }

    #[test]
    fn a_mode_that_takes_more_than_half_a_redis_core_is_out_unless_all_do() {
        // tight-burst-fleet's rate leases and fixed leases of 5 tokens, which admit the most
        // at 0.56 of a core (with rates by default, tried, it was recommended).
        let mut modes = [
            m("pure-redis", 0.2828, 0.9130, 0, 1_481_868),
            m("hybrid-rate", 0.9866, 0.9942, 0, 45_384),
            m("hybrid-fixed", 0.9984, 0.9955, 0, 824_882),
            m("static-share", 0.4106, 0.9370, 0, 0),
        ];
        assert_eq!(picked(&modes), "hybrid-fixed");
        with_cpu(&mut modes, &[1.0003, 0.0533, 0.5568, 0.0]);
        assert_eq!(picked(&modes), "hybrid-rate");
        let why = &recommend(&modes)[1];
        assert!(
            why.ends_with("; not hybrid-fixed (0.9984): 0.56 core of Redis, above 0.5"),
            "{why}"
        );
        // Where every mode that calls the store takes more, the rule looks at them all: static
        // shares, affordable by making no calls, do not win by that alone.
        for mode in &mut modes[..3] {
            mode.redis_cpu = 0.9;
        }
        assert_eq!(picked(&modes), "hybrid-fixed");
    }

    #[test]
    fn redis_time_buys_more_than_two_points_of_utilization() {
        // moving-hotspot-fleet: the default follows the hot spot at 0.54 of a core; static
        // shares (affordable, and fair by Jain's index over a thousand nodes) admit 8 points
        // less, rate leases 13.
        let mut modes = [
            m("pure-redis", 0.3573, 0.9974, 0, 1_487_770),
            m("hybrid", 0.9970, 0.9994, 0, 459_406),
            m("hybrid-rate", 0.8634, 0.9984, 0, 46_078),
            m("hybrid-fixed", 0.9984, 0.9968, 0, 795_916),
            m("static-share", 0.9164, 0.9959, 0, 0),
        ];
        with_cpu(&mut modes, &[1.0042, 0.5398, 0.0541, 0.5372, 0.0]);
        assert_eq!(picked(&modes), "hybrid");
        let why = &recommend(&modes)[1];
        assert!(
            why.ends_with(
                "; 0.54 core of Redis, above 0.5, kept: the affordable modes' pick admits 0.9164 \
                 (static-share), more than 0.02 less"
            ),
            "{why}"
        );
        // Nor a mode that keeps a whole core busy, whatever it admits.
        let mut saturating = modes;
        saturating[1].redis_cpu = 1.02;
        saturating[3].redis_cpu = 1.02;
        assert_eq!(picked(&saturating), "static-share");
        // Within two points, the affordable pick.
        modes[4].utilization = 0.9780;
        assert_eq!(picked(&modes), "static-share");
    }

    #[test]
    fn calls_within_a_tenth_of_the_fewest_go_by_utilization() {
        // low-rate: leasing saves 3 % of pure mode's calls and admits less.
        let modes = [
            m("pure-redis", 0.9984, 0.9990, 0, 2_451),
            m("hybrid", 0.9967, 0.9879, 0, 2_381),
            m("hybrid-rate", 0.9926, 0.9826, 0, 2_368),
        ];
        assert_eq!(picked(&modes), "pure-redis");
        assert!(
            recommend(&modes)[1].ends_with("the best utilization of the fair modes, no overshoot")
        );
        // A fifth fewer: the calls win.
        let mut cheaper = modes;
        cheaper[2].store_calls = 1_900;
        assert_eq!(picked(&cheaper), "hybrid-rate");
    }

    #[test]
    fn overshoot_rules_a_mode_out_whatever_else_it_does() {
        let modes = [
            m("hybrid", 0.99, 0.99, 0, 1_000),
            m("hybrid-fixed", 0.999, 0.999, 12, 10),
        ];
        assert_eq!(picked(&modes), "hybrid");
        let all_over = [m("hybrid-fixed", 0.999, 0.999, 12, 10)];
        assert!(recommend(&all_over)[0].contains("none"));
        assert!(recommend(&[]).is_empty());
    }

    #[test]
    fn where_no_mode_is_fair_the_fairest_set_the_bar() {
        // Jain 0.95 at best: within a point of it counts.
        let modes = [
            m("hybrid", 0.99, 0.95, 0, 1_000),
            m("hybrid-rate", 0.985, 0.945, 0, 500),
            m("static-share", 0.99, 0.90, 0, 0),
        ];
        assert_eq!(picked(&modes), "hybrid-rate");
        // The same run twice (the default leases rates here too): the first listed.
        let same = [
            m("hybrid", 0.9985, 0.9999, 0, 1_318),
            m("hybrid-rate", 0.9985, 0.9999, 0, 1_318),
        ];
        assert_eq!(picked(&same), "hybrid");
    }

    #[test]
    fn an_unfair_mode_sets_no_bar_for_the_fair_ones() {
        // The best utilization is unfair: the fair mode a point and a half below it is picked.
        let modes = [
            m("hybrid", 0.985, 0.99, 0, 1_000),
            m("static-share", 0.999, 0.90, 0, 0),
        ];
        assert_eq!(picked(&modes), "hybrid");
        // With a fair mode, the bar is `FAIR_JAIN`, not a point below the fairest: 0.976 is not
        // fair beside 0.985.
        let modes = [
            m("hybrid", 0.99, 0.985, 0, 1_000),
            m("hybrid-rate", 0.99, 0.976, 0, 100),
        ];
        assert_eq!(picked(&modes), "hybrid");
    }

    #[test]
    fn a_mode_without_a_store_comes_with_its_caveat() {
        let modes = [
            m("hybrid", 0.9926, 1.0, 0, 1_281),
            m("static-share", 0.9995, 1.0, 0, 0),
        ];
        assert_eq!(picked(&modes), "static-share");
        assert!(recommend(&modes)[0].contains("only while demand stays this even"));
    }
}
