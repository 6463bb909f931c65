// Package lease is the credential lease shared by the Edge and the Node
// (SPEC R11, S4; ARCHITECTURE.md decision 9). Credentials never rest on a
// Node: for each dispatch the Edge issues a short-lived lease that carries
// the credential's value, signed with the Edge's Ed25519 key and sealed to
// the Node's X25519 key. The Node opens it immediately before the provider
// call, after capacity admission, and refuses it unless every check passes.
//
// The Edge uses an Issuer; the Node uses one Opener for its lifetime (it
// holds the replay cache and the revocation state, so it must outlive
// connections).
//
// # Format
//
// A lease is three layers, from the inside out:
//
//	leasepb.Lease   the claims and the secret, as protobuf:
//	                lease_id, principal, route, slot, profile, target,
//	                provider, node_id, credential, credential_revision,
//	                generation, issued_unix_ms, expires_unix_ms, secret
//	leasepb.Signed  payload   = the marshalled Lease, byte for byte
//	                signature = Ed25519(Edge key, "iop-lease-v1\x00" ||
//	                            recipient X25519 public key (32 bytes) ||
//	                            payload)
//	sealed          Version (1 byte, = 1) ||
//	                KeyID of the recipient (8 bytes: the first 8 bytes of
//	                SHA-256 of its X25519 public key) ||
//	                box.SealAnonymous(marshalled Signed, recipient public key)
//
// The signature covers the recipient's public key as well as the payload,
// so a lease cannot be re-sealed to another key, not even by the Node it
// was meant for (who can open it). The key id lets a Node tell "not for me"
// (wrong_recipient) from "tampered" (malformed) without trying to decrypt.
// Times travel as Unix milliseconds; sub-millisecond parts of Claims are
// dropped.
//
// Limits: a sealed lease is at most MaxSealedSize bytes, the secret at most
// MaxSecretSize, the lease id at most MaxIDSize, and a lease lives at most
// MaxLifetime (expires - issued). A Lease or Signed with fields this
// package does not know is refused: an unknown field may be a binding the
// Node cannot check, so a new field needs a new protocol version.
//
// Required fields: lease_id, node_id, provider, credential, a non-zero
// generation, issued_unix_ms > 0, expires_unix_ms > issued_unix_ms, and a
// non-empty secret. principal, route, slot, profile and target may be empty,
// but are still compared exactly.
//
// # Checks
//
// Open refuses with a *RejectedError whose Reason says which check failed.
// The checks run in this order; the first failure is reported:
//
//  1. The envelope, outside in. malformed: empty or oversized input, or an
//     unknown version byte. wrong_recipient: the key id is not this Node's
//     key. malformed: no Edge signing key known yet; a box that does not
//     open although the key id is this Node's (tampered); an unparsable
//     Signed or Lease, or one with unknown fields; a bad signature
//     (forged, tampered, or signed for another recipient); a missing field
//     or one over its limit.
//  2. expired: the lease expired more than the skew ago (now > expires +
//     skew), or was issued more than the skew in the future (issued > now +
//     skew). Both boundaries are inclusive: a lease still opens at exactly
//     expires + skew, and when issued exactly skew ahead of now.
//  3. disabled: the lease's profile or credential is disabled.
//  4. revoked: the lease's credential revision is below the revocation
//     revision for that credential.
//  5. stale: the lease's generation is not the dispatch's (a lease of
//     another connection), or its credential revision is below the highest
//     revision of that credential on a lease this Opener already opened.
//  6. mismatched: principal, route, slot, profile, target, provider or
//     node_id differs from the dispatch's Binding. The detail names the
//     fields, not their values.
//  7. replayed: a lease with this id was already opened.
//
// Revocations and disables come from the Edge as a wirepb.CredentialNotice
// (Opener.Apply): credential_revisions[c] = r revokes every revision of c
// below r, and only ever rises; disabled_profiles and disabled_credentials
// are the full current sets, replacing the previous ones.
//
// # What is recorded
//
// Only a lease that passed every check is recorded: its id enters the
// replay cache and its revision raises the highest revision seen for its
// credential. A refused lease, even one whose signature verified, leaves no
// trace, so a lease refused for a reason that is later fixed (a binding the
// Node got wrong, a profile enabled again) can still be opened once. This
// never allows two uses: a lease is only usable once opened, and opening
// burns it.
//
// # Replay cache
//
// The cache keeps an opened lease's id until its expiry plus the skew;
// after that the lease is refused as expired anyway, so forgetting it is
// safe. To stay safe when the clock steps backwards, expiry is judged
// against the latest time the Opener has seen, not only the current one.
// The cache holds at most OpenerConfig.MaxReplay live ids. When it is full
// and none has expired, Open refuses with ErrReplayCacheFull rather than
// evict a live id (evicting would let that lease be replayed). That error
// is not a *RejectedError: the lease is not at fault, it is not burned, and
// it opens once ids expire.
//
// # Secrets
//
// The secret is never formatted into an error, a log value or a String of
// Lease, and no check compares it. Open wipes every plaintext buffer it
// made and, on refusal, the parsed secret too; the caller wipes the
// returned Lease (Lease.Wipe) as soon as the provider call has the value.
package lease
