//! Bounds-checked big-endian reading and writing, and QUIC-style varints:
//! the only code in the WAN format that touches bytes by index, so that
//! every parser above it (`header`, `frames`, and `msg`) cannot read past
//! a slice's end.

/// Largest value a QUIC-style varint holds.
pub const MAX_VARINT: u64 = (1 << 62) - 1;

/// Bounds-checked big-endian reader.
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b }
    }
    /// What is left to read, without consuming it.
    pub fn remaining(&self) -> &'a [u8] {
        self.b
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.first().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }
    /// QUIC variable-length integer: the top two bits of the first byte give
    /// the length (1, 2, 4 or 8 bytes). Non-minimal encodings are accepted.
    pub fn varint(&mut self) -> Option<u64> {
        let first = *self.b.first()?;
        let len = 1usize << (first >> 6);
        let raw = self.take(len)?;
        let mut v = u64::from(raw[0] & 0x3f);
        for &x in &raw[1..] {
            v = (v << 8) | u64::from(x);
        }
        Some(v)
    }
}

/// Bounds-checked writer into a caller's buffer; every method returns `false`
/// (writing nothing) when the value does not fit.
pub struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Writer<'a> {
        Writer { buf, len: 0 }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.len
    }
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    pub fn bytes(&mut self, b: &[u8]) -> bool {
        if b.len() > self.remaining() {
            return false;
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        true
    }
    pub fn u8(&mut self, v: u8) -> bool {
        self.bytes(&[v])
    }
    pub fn u64(&mut self, v: u64) -> bool {
        self.bytes(&v.to_be_bytes())
    }
    pub fn varint(&mut self, v: u64) -> bool {
        if v < 1 << 6 {
            self.u8(v as u8)
        } else if v < 1 << 14 {
            self.bytes(&((v as u16) | 0x4000).to_be_bytes())
        } else if v < 1 << 30 {
            self.bytes(&((v as u32) | 0x8000_0000).to_be_bytes())
        } else if v <= MAX_VARINT {
            self.bytes(&(v | 0xC000_0000_0000_0000).to_be_bytes())
        } else {
            false
        }
    }
}
