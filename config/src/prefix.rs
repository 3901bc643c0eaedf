//! CIDR prefixes (`10.1.0.0/16`, `fd00:1::/48`) for the data-center ACL.
//!
//! Hand-rolled because it is tiny and because we want opinionated errors: a
//! prefix with host bits set (`10.1.0.1/16`) is almost always a typo in an
//! ACL, so it is rejected with the corrected spelling instead of being
//! silently masked.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network: `addr` has no bits set beyond the first `len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

/// The text could not be read as a CIDR prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PrefixError(pub String);

/// What a prefix may look like (used in error messages).
pub const PREFIX_ACCEPTED: &str =
    "a CIDR prefix like \"10.1.0.0/16\" or \"fd00:1::/48\" (address/length, host bits zero)";

/// Address as a 128-bit number plus its family width, so one masking routine
/// serves both families.
fn bits(addr: IpAddr) -> (u128, u8) {
    match addr {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

/// The network mask for a prefix of `len` bits within a `width`-bit family.
fn mask(len: u8, width: u8) -> u128 {
    let all = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    // Shifting by the full width is undefined for the type; len == 0 is "no bits".
    match u32::from(width - len.min(width)) {
        128 => 0,
        host => all & !((1u128 << host) - 1),
    }
}

fn from_bits(value: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::from((value as u32).to_be_bytes()),
        IpAddr::V6(_) => IpAddr::from(value.to_be_bytes()),
    }
}

impl Prefix {
    /// Builds a prefix, rejecting lengths beyond the family and set host bits.
    pub fn new(addr: IpAddr, len: u8) -> Result<Prefix, PrefixError> {
        let (value, width) = bits(addr);
        if len > width {
            let family = if width == 32 { "IPv4" } else { "IPv6" };
            return Err(PrefixError(format!(
                "prefix length {len} is out of range for {family} (0..={width})"
            )));
        }
        let network = value & mask(len, width);
        if network != value {
            let fixed = from_bits(network, addr);
            return Err(PrefixError(format!(
                "{addr}/{len} has host bits set; did you mean {fixed}/{len}?"
            )));
        }
        Ok(Prefix { addr, len })
    }

    /// Whether `ip` is inside this network. Families never match each other
    /// (an IPv4 prefix does not contain IPv4-mapped IPv6 addresses).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let (net, width) = bits(self.addr);
        let (value, ip_width) = bits(ip);
        width == ip_width && value & mask(self.len, width) == net
    }

    /// Whether the two networks share at least one address; for CIDR blocks
    /// that means one contains the other.
    pub fn overlaps(&self, other: &Prefix) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;

    fn from_str(s: &str) -> Result<Prefix, PrefixError> {
        let s = s.trim();
        let Some((addr, len)) = s.split_once('/') else {
            return Err(PrefixError(format!(
                "\"{s}\" has no /length; expected {PREFIX_ACCEPTED}"
            )));
        };
        let addr: IpAddr = addr.parse().map_err(|_| {
            PrefixError(format!(
                "\"{addr}\" is not an IP address; expected {PREFIX_ACCEPTED}"
            ))
        })?;
        // u8::from_str would accept "+16"; only plain digits are a length.
        let len = (!len.is_empty() && len.len() <= 3 && len.bytes().all(|b| b.is_ascii_digit()))
            .then(|| len.parse::<u8>().ok())
            .flatten()
            .ok_or_else(|| {
                PrefixError(format!(
                    "\"{len}\" is not a prefix length; expected {PREFIX_ACCEPTED}"
                ))
            })?;
        Prefix::new(addr, len)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_contains() {
        let net = p("10.1.0.0/16");
        assert_eq!(net.addr, ip("10.1.0.0"));
        assert_eq!(net.len, 16);
        assert!(net.contains(ip("10.1.0.0")));
        assert!(net.contains(ip("10.1.255.255")));
        assert!(!net.contains(ip("10.2.0.0")));
        assert!(!net.contains(ip("10.0.255.255")));
        assert!(!net.contains(ip("::ffff:10.1.0.1")));
        assert!(p("0.0.0.0/0").contains(ip("203.0.113.7")));
        assert!(p("192.0.2.7/32").contains(ip("192.0.2.7")));
        assert!(!p("192.0.2.7/32").contains(ip("192.0.2.8")));
        let v6 = p("fd00:1::/48");
        assert!(v6.contains(ip("fd00:1:0:ffff::1")));
        assert!(!v6.contains(ip("fd00:2::1")));
        assert!(!v6.contains(ip("10.1.0.1")));
        assert!(p("::/0").contains(ip("2001:db8::1")));
        assert!(p("2001:db8::1/128").contains(ip("2001:db8::1")));
        assert_eq!(p(" 10.1.0.0/16 ").to_string(), "10.1.0.0/16");
    }

    #[test]
    fn overlap() {
        assert!(p("10.0.0.0/8").overlaps(&p("10.1.0.0/16")));
        assert!(p("10.1.0.0/16").overlaps(&p("10.0.0.0/8")));
        assert!(!p("10.1.0.0/16").overlaps(&p("10.2.0.0/16")));
        assert!(!p("0.0.0.0/0").overlaps(&p("::/0")));
    }

    #[test]
    fn host_bits_get_a_suggestion() {
        let e = "10.1.0.1/16".parse::<Prefix>().unwrap_err().0;
        assert_eq!(
            e,
            "10.1.0.1/16 has host bits set; did you mean 10.1.0.0/16?"
        );
        let e = "fd00:1::1/48".parse::<Prefix>().unwrap_err().0;
        assert_eq!(
            e,
            "fd00:1::1/48 has host bits set; did you mean fd00:1::/48?"
        );
    }

    #[test]
    fn malformed() {
        for bad in [
            "10.1.0.0",
            "10.1.0.0/",
            "10.1.0.0/+16",
            "10.1.0.0/x",
            "10.1.0/16",
            "/16",
            "",
        ] {
            assert!(bad.parse::<Prefix>().is_err(), "{bad}");
        }
        let e = "10.1.0.0/33".parse::<Prefix>().unwrap_err().0;
        assert!(e.contains("out of range for IPv4 (0..=32)"), "{e}");
        let e = "::/129".parse::<Prefix>().unwrap_err().0;
        assert!(e.contains("out of range for IPv6 (0..=128)"), "{e}");
        assert!("10.1.0.0/0016".parse::<Prefix>().is_err());
    }
}
