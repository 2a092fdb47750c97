//! MD2 (RFC 1319) and HMAC-MD2 (RFC 2104 with MD2's 16-byte block): the CUDA runtime's
//! integrity check asks the driver for an HMAC-MD2 of the calling process and devices
//! ([`crate::export_tables`]), and refuses a driver whose answer is wrong.

/// RFC 1319's permutation of 0..=255, built from the digits of pi.
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2's block (and digest) size.
pub const BLOCK: usize = 16;

/// An incremental MD2 hasher (fixed-size state: no allocation).
pub struct Md2 {
    state: [u8; 48],
    checksum: [u8; BLOCK],
    pending: [u8; BLOCK],
    pending_len: usize,
}

impl Md2 {
    /// A hasher over the empty message.
    pub fn new() -> Md2 {
        Md2 {
            state: [0; 48],
            checksum: [0; BLOCK],
            pending: [0; BLOCK],
            pending_len: 0,
        }
    }

    fn compress(&mut self, block: &[u8; BLOCK]) {
        for (index, &byte) in block.iter().enumerate() {
            self.state[BLOCK + index] = byte;
            self.state[2 * BLOCK + index] = byte ^ self.state[index];
        }
        let mut carry = 0u8;
        for round in 0..18u8 {
            for byte in self.state.iter_mut() {
                *byte ^= PI_SUBST[carry as usize];
                carry = *byte;
            }
            carry = carry.wrapping_add(round);
        }
        let mut last = self.checksum[BLOCK - 1];
        for (sum, &byte) in self.checksum.iter_mut().zip(block) {
            *sum ^= PI_SUBST[(byte ^ last) as usize];
            last = *sum;
        }
    }

    /// Adds `bytes` to the message.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = (BLOCK - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len == BLOCK {
                let block = self.pending;
                self.compress(&block);
                self.pending_len = 0;
            }
        }
    }

    /// The 16-byte digest.
    pub fn finish(mut self) -> [u8; BLOCK] {
        let pad = (BLOCK - self.pending_len) as u8;
        self.update(&[pad; BLOCK][..pad as usize]);
        let checksum = self.checksum;
        self.compress(&checksum);
        let mut digest = [0; BLOCK];
        digest.copy_from_slice(&self.state[..BLOCK]);
        digest
    }
}

impl Default for Md2 {
    fn default() -> Md2 {
        Md2::new()
    }
}

/// HMAC-MD2 of the concatenation of `parts` under a key of at most one block.
pub fn hmac(key: &[u8; BLOCK], parts: &[&[u8]]) -> [u8; BLOCK] {
    let mut inner = Md2::new();
    inner.update(&key.map(|byte| byte ^ 0x36));
    for part in parts {
        inner.update(part);
    }
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&key.map(|byte| byte ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn md2(bytes: &[u8]) -> String {
        let mut hasher = Md2::new();
        hasher.update(bytes);
        hex(&hasher.finish())
    }

    #[test]
    fn rfc_1319_test_suite() {
        assert_eq!(md2(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2(b"a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2(b"message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn split_updates_hash_like_one() {
        let mut hasher = Md2::new();
        for piece in [&b"mess"[..], b"age dig", b"est"] {
            hasher.update(piece);
        }
        assert_eq!(hex(&hasher.finish()), md2(b"message digest"));
    }

    #[test]
    fn hmac_keys_inner_and_outer_hashes() {
        let key = [0x0b; BLOCK];
        let mut inner = Md2::new();
        inner.update(&[0x0b ^ 0x36; BLOCK]);
        inner.update(b"Hi There");
        let mut outer = Md2::new();
        outer.update(&[0x0b ^ 0x5c; BLOCK]);
        outer.update(&inner.finish());
        assert_eq!(hmac(&key, &[b"Hi ", b"There"]), outer.finish());
    }
}
