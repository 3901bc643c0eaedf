//! Link models shared by the WAN transport's tests (`wan::tests`) and the
//! lab tools' simulator and emulator (`soya_tools::sim::link`): one
//! definition, so that what the tests call burst loss is what the
//! simulator runs. No randomness of its own: the caller draws.

/// Gilbert–Elliott burst loss: a two-state chain; losses happen mostly in
/// the bad state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GilbertElliott {
    /// Probability per packet of going good → bad.
    pub p_enter_bad: f64,
    /// Probability per packet of going bad → good.
    pub p_leave_bad: f64,
    /// Loss probability while bad.
    pub loss_in_bad: f64,
}

impl GilbertElliott {
    /// One packet: moves the chain (`bad` is its state) and says whether
    /// the packet is lost. `uniform` draws from [0, 1): once for the move,
    /// and once more for the loss while bad.
    pub fn lose(&self, bad: &mut bool, mut uniform: impl FnMut() -> f64) -> bool {
        let flip = if *bad {
            self.p_leave_bad
        } else {
            self.p_enter_bad
        };
        if uniform() < flip {
            *bad = !*bad;
        }
        *bad && uniform() < self.loss_in_bad
    }
}

#[cfg(test)]
mod tests {
    use super::GilbertElliott;

    #[test]
    fn stays_good_and_loses_nothing_without_entering_bad() {
        let ge = GilbertElliott {
            p_enter_bad: 0.0,
            p_leave_bad: 1.0,
            loss_in_bad: 1.0,
        };
        let mut bad = false;
        assert!((0..100).all(|_| !ge.lose(&mut bad, || 0.5)));
    }

    #[test]
    fn loses_everything_once_stuck_in_bad() {
        let ge = GilbertElliott {
            p_enter_bad: 1.0,
            p_leave_bad: 0.0,
            loss_in_bad: 1.0,
        };
        let mut bad = false;
        assert!((0..100).all(|_| ge.lose(&mut bad, || 0.5)));
    }
}
