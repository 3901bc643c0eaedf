//! Sliding anti-replay window over one path's packet numbers.
//!
//! Remembers which of the last [`WINDOW`] packet numbers below the largest
//! accepted one were seen. Anything older than the window is refused: an
//! attacker (or the network) may re-send any packet it captured, and the AEAD
//! alone cannot tell a copy from the original. The window is a fixed bitmap,
//! so it costs 256 bytes per path whatever the traffic.
//!
//! Use [`ReplayWindow::check`] before decrypting (a cheap filter) and
//! [`ReplayWindow::accept`] only after the packet authenticated, so forged
//! packets can never move the window.

/// Packets tracked below the largest accepted one.
pub const WINDOW: u64 = 2048;
const WORDS: usize = (WINDOW / 64) as usize;

#[derive(Clone)]
pub struct ReplayWindow {
    /// Largest accepted packet number, `None` before the first.
    largest: Option<u64>,
    /// Bit `pn % WINDOW` set: `pn` seen (for pn within the window).
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            largest: None,
            bits: [0; WORDS],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fresh,
    /// Seen before.
    Duplicate,
    /// Older than the window: cannot tell, so refused.
    TooOld,
}

impl ReplayWindow {
    fn bit(pn: u64) -> (usize, u64) {
        let i = pn % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    pub fn check(&self, pn: u64) -> Verdict {
        let Some(largest) = self.largest else {
            return Verdict::Fresh;
        };
        if pn > largest {
            return Verdict::Fresh;
        }
        if largest - pn >= WINDOW {
            return Verdict::TooOld;
        }
        let (w, m) = Self::bit(pn);
        if self.bits[w] & m != 0 {
            Verdict::Duplicate
        } else {
            Verdict::Fresh
        }
    }

    /// Records `pn` (which passed [`check`](Self::check) and authenticated).
    pub fn accept(&mut self, pn: u64) {
        match self.largest {
            Some(largest) if pn <= largest => {}
            Some(largest) => {
                // Slide: forget the bits the window moves past.
                let d = pn - largest;
                if d >= WINDOW {
                    self.bits = [0; WORDS];
                } else {
                    for old in largest + 1..=pn {
                        let (w, m) = Self::bit(old);
                        self.bits[w] &= !m;
                    }
                }
                self.largest = Some(pn);
            }
            None => {
                self.bits = [0; WORDS];
                self.largest = Some(pn);
            }
        }
        let (w, m) = Self::bit(pn);
        self.bits[w] |= m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_semantics() {
        let mut r = ReplayWindow::default();
        assert_eq!(r.check(5), Verdict::Fresh);
        r.accept(5);
        assert_eq!(r.check(5), Verdict::Duplicate);
        assert_eq!(r.check(4), Verdict::Fresh, "reordered, not seen");
        r.accept(4);
        assert_eq!(r.check(4), Verdict::Duplicate);
        r.accept(5 + WINDOW - 1);
        assert_eq!(r.check(5), Verdict::Duplicate, "still inside");
        assert_eq!(r.check(4), Verdict::TooOld);
        r.accept(10 * WINDOW);
        assert_eq!(r.check(10 * WINDOW), Verdict::Duplicate);
        assert_eq!(r.check(10 * WINDOW - 1), Verdict::Fresh);
        assert_eq!(r.check(9 * WINDOW), Verdict::TooOld);
        // A slot reused by a later packet number is not confused with the old.
        let mut r = ReplayWindow::default();
        r.accept(1);
        r.accept(1 + WINDOW);
        assert_eq!(r.check(1 + WINDOW), Verdict::Duplicate);
        assert_eq!(r.check(1 + WINDOW - 1), Verdict::Fresh);
    }
}
