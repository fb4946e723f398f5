//! Diffie-Hellman over the RFC 7919 groups, as DH-HMAC-CHAP uses it: each
//! side sends g^x mod p as a big-endian number exactly as long as p, and the
//! shared secret Ks = (g^y)^x mod p, also padded to the length of p, feeds
//! the augmented challenge.
//!
//! Exponentiation is crypto-bigint's constant-time Montgomery ladder over a
//! private exponent of a fixed bit length (at least twice the group's
//! security strength, as RFC 7919 section 5.2 asks).

use super::ffdhe;
use super::codes::DhGroup;
use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use std::sync::OnceLock;
use zeroize::Zeroizing;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DhError {
    #[error("the peer's DH value is {got} bytes, the group needs {want}")]
    Length { got: usize, want: usize },
    #[error("the peer's DH value is outside 2..p-2")]
    Range,
    #[error("the null group has no DH exchange")]
    NullGroup,
}

fn prime_hex(g: DhGroup) -> Option<&'static str> {
    Some(match g {
        DhGroup::Null => return None,
        DhGroup::Ffdhe2048 => ffdhe::FFDHE2048,
        DhGroup::Ffdhe3072 => ffdhe::FFDHE3072,
        DhGroup::Ffdhe4096 => ffdhe::FFDHE4096,
        DhGroup::Ffdhe6144 => ffdhe::FFDHE6144,
        DhGroup::Ffdhe8192 => ffdhe::FFDHE8192,
    })
}

fn hex_bytes(h: &str) -> Vec<u8> {
    h.as_bytes()
        .chunks(2)
        .map(|p| {
            let d = |c: u8| {
                (c as char)
                    .to_digit(16)
                    .unwrap_or_else(|| unreachable!("constant hex")) as u8
            };
            d(p[0]) << 4 | d(p[1])
        })
        .collect()
}

/// Montgomery parameters of a group, computed once.
fn params(g: DhGroup) -> Option<&'static BoxedMontyParams> {
    static CACHE: [OnceLock<BoxedMontyParams>; 5] = [const { OnceLock::new() }; 5];
    let hex = prime_hex(g)?;
    let slot = &CACHE[g.id() as usize - 1];
    Some(slot.get_or_init(|| {
        let p = BoxedUint::from_be_slice(&hex_bytes(hex), g.prime_bits())
            .unwrap_or_else(|_| unreachable!("prime fits its size"));
        let odd = Option::<Odd<BoxedUint>>::from(Odd::new(p))
            .unwrap_or_else(|| unreachable!("safe primes are odd"));
        BoxedMontyParams::new(odd)
    }))
}

/// Bits of the private exponent.
fn exponent_bits(g: DhGroup) -> u32 {
    match g {
        DhGroup::Null => 0,
        DhGroup::Ffdhe2048 => 256,
        DhGroup::Ffdhe3072 => 320,
        DhGroup::Ffdhe4096 => 384,
        DhGroup::Ffdhe6144 => 448,
        DhGroup::Ffdhe8192 => 512,
    }
}

/// base^exp mod p, big-endian, as long as p. `exp_bits` bounds the ladder
/// (its length is public; the exponent's value is not leaked by timing).
fn modexp(
    params: &BoxedMontyParams,
    base: &BoxedUint,
    exp: &BoxedUint,
    exp_bits: u32,
) -> Zeroizing<Vec<u8>> {
    let r = BoxedMontyForm::new(base.clone(), params)
        .pow_bounded_exp(exp, exp_bits)
        .retrieve();
    Zeroizing::new(r.to_be_bytes().into_vec())
}

/// One side's DH key pair for one transaction.
pub struct KeyPair {
    group: DhGroup,
    private: Zeroizing<BoxedUint>,
    public: Vec<u8>,
}

impl KeyPair {
    /// A key pair from 64 random bytes. The exponent takes the group's
    /// number of bits with the top one set, so it is never 0 or 1.
    pub fn generate(group: DhGroup, random: &[u8]) -> Result<KeyPair, DhError> {
        let params = params(group).ok_or(DhError::NullGroup)?;
        let bits = group.prime_bits();
        let xb = exponent_bits(group);
        let mut x = Zeroizing::new(random[..(xb as usize / 8).min(random.len())].to_vec());
        if let Some(top) = x.first_mut() {
            *top |= 0x80;
        }
        let private = Zeroizing::new(
            BoxedUint::from_be_slice(&x, bits)
                .unwrap_or_else(|_| unreachable!("exponent shorter than p")),
        );
        let g = BoxedUint::from_be_slice(&[2], bits).unwrap_or_else(|_| unreachable!("2 fits"));
        let public = modexp(params, &g, &private, xb).to_vec();
        Ok(KeyPair {
            group,
            private,
            public,
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// g^x mod p, as the Challenge or Reply carries it.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// Ks = peer^x mod p. The peer's value must be exactly as long as p
    /// and lie in 2..=p-2 (1 and p-1 would force a known secret).
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let params = params(self.group).ok_or(DhError::NullGroup)?;
        let bits = self.group.prime_bits();
        let want = self.group.value_len();
        if peer.len() != want {
            return Err(DhError::Length {
                got: peer.len(),
                want,
            });
        }
        let y = BoxedUint::from_be_slice(peer, bits).map_err(|_| DhError::Range)?;
        let one = BoxedUint::one_with_precision(bits);
        let p_minus_1 = params.modulus().as_ref().wrapping_sub(&one);
        if y <= one || y >= p_minus_1 {
            return Err(DhError::Range);
        }
        Ok(modexp(params, &y, &self.private, exponent_bits(self.group)))
    }
}

#[cfg(test)]
pub(crate) fn raw_modexp(group: DhGroup, base: &[u8], exp: &[u8]) -> Vec<u8> {
    let params = params(group).unwrap();
    let bits = group.prime_bits();
    let b = BoxedUint::from_be_slice(base, bits).unwrap();
    let e = BoxedUint::from_be_slice(exp, bits).unwrap();
    modexp(params, &b, &e, bits).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(name: &str) -> Vec<u8> {
        let text = include_str!("testdata/ffdhe2048-openssl.txt");
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap();
        hex_bytes(line.split_once(' ').unwrap().1.trim())
    }

    /// What one exponentiation costs, per group (compare with
    /// `openssl speed ffdh2048 ffdh8192`, which times one key agreement):
    /// `cargo test --release -p bw-nvme dh_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn dh_speed() {
        for g in DhGroup::ALL.into_iter().skip(1) {
            let t0 = std::time::Instant::now();
            let n = 5;
            for i in 0..n {
                let a = KeyPair::generate(g, &[i as u8 + 1; 64]).unwrap();
                let b = KeyPair::generate(g, &[i as u8 + 9; 64]).unwrap();
                a.shared_secret(b.public()).unwrap();
            }
            println!(
                "{g}: {:.1} ms per modexp",
                t0.elapsed().as_secs_f64() * 1000.0 / (3 * n) as f64
            );
        }
    }

    #[test]
    fn agrees_with_openssl() {
        let (a_priv, a_pub, b_pub, shared) = (
            vector("a_private"),
            vector("a_public"),
            vector("b_public"),
            vector("shared"),
        );
        assert_eq!(raw_modexp(DhGroup::Ffdhe2048, &[2], &a_priv), a_pub);
        assert_eq!(raw_modexp(DhGroup::Ffdhe2048, &b_pub, &a_priv), shared);
    }

    #[test]
    fn every_group_is_a_safe_prime_with_generator_of_order_q() {
        for g in DhGroup::ALL.into_iter().skip(1) {
            let p = hex_bytes(prime_hex(g).unwrap());
            assert_eq!(p.len(), g.value_len());
            assert!(
                p[..8].iter().chain(&p[p.len() - 8..]).all(|&b| b == 0xFF),
                "{g}: RFC 7919 primes start and end with 64 one bits"
            );
            // q = (p - 1) / 2; 2^q = 1 (mod p) means 2 generates the order-q subgroup.
            let mut q = p.clone();
            let mut carry = 0u8;
            for b in q.iter_mut() {
                let v = *b;
                *b = (v >> 1) | (carry << 7);
                carry = v & 1;
            }
            let mut one = vec![0u8; p.len()];
            one[p.len() - 1] = 1;
            assert_eq!(raw_modexp(g, &[2], &q), one, "{g}");
        }
    }

    #[test]
    fn key_agreement_and_public_value_checks() {
        for g in DhGroup::ALL.into_iter().skip(1) {
            let a = KeyPair::generate(g, &[0x11; 64]).unwrap();
            let b = KeyPair::generate(g, &[0x5A; 64]).unwrap();
            assert_eq!(a.public().len(), g.value_len());
            assert_ne!(a.public(), b.public());
            let ka = a.shared_secret(b.public()).unwrap();
            assert_eq!(*ka, *b.shared_secret(a.public()).unwrap(), "{g}");
            assert_eq!(ka.len(), g.value_len());
            let mut one = vec![0u8; g.value_len()];
            one[g.value_len() - 1] = 1;
            assert_eq!(a.shared_secret(&one), Err(DhError::Range));
            let p = hex_bytes(prime_hex(g).unwrap());
            let mut pm1 = p.clone();
            *pm1.last_mut().unwrap() -= 1;
            assert_eq!(a.shared_secret(&pm1), Err(DhError::Range));
            assert_eq!(a.shared_secret(&p), Err(DhError::Range));
            assert_eq!(
                a.shared_secret(&[0xFF; 8]),
                Err(DhError::Length {
                    got: 8,
                    want: g.value_len()
                })
            );
        }
        assert!(KeyPair::generate(DhGroup::Null, &[0; 64]).is_err());
    }
}
