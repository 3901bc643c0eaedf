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

    /// Packets lost of 100 from the good state (always lost in the bad
    /// one), every draw 0.5.
    fn losses_of_100(p_enter_bad: f64, p_leave_bad: f64) -> usize {
        let ge = GilbertElliott {
            p_enter_bad,
            p_leave_bad,
            loss_in_bad: 1.0,
        };
        let mut bad = false;
        (0..100).filter(|_| ge.lose(&mut bad, || 0.5)).count()
    }

    #[test]
    fn stays_good_and_loses_nothing_without_entering_bad() {
        assert_eq!(losses_of_100(0.0, 1.0), 0);
    }

    #[test]
    fn loses_everything_once_stuck_in_bad() {
        assert_eq!(losses_of_100(1.0, 0.0), 100);
    }
}
