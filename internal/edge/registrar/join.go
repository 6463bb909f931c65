package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Join slots. A join connection comes from anyone who reaches the Edge's
// UDP port (the join ALPN asks for no certificate), so what it may hold is
// bounded three ways, and none of them lets strangers keep a real Node out
// for long (issue 24 gap 6):
//
//   - maxJoins exchanges at once in all, each bounded in size
//     (wireenroll.MaxJoinFrameSize) and time (wireenroll.JoinTimeout);
//   - maxJoinsPerSource of them from one source (an IPv4 address, or an
//     IPv6 /64: one host or site holds a whole /64), so that one stranger
//     cannot take every slot;
//   - joinRequestTimeout for the whole request to arrive once the
//     handshake is done: a Node sends it at once (about 2 KiB), so a
//     connection that stays silent gives its slot back in seconds, not at
//     the end of the exchange's 15 s.
//
// A slot is given back as soon as the answer is written; the connection
// then lingers at most answerLinger for the Node to read it and close.
//
// On a join connection the Edge closes with quicwire.CloseRefused only to
// say "not now" (slots taken, or no request in time), always with a
// detail that ends "try again": `noded join` tries again on it. Every
// refusal of the token is a JoinResponse, never a close.
const (
	maxJoins           = 16
	maxJoinsPerSource  = 2
	joinRequestTimeout = 3 * time.Second
	answerLinger       = 5 * time.Second
)

// refusal is a join refused with a code the Node understands.
type refusal struct {
	code   wirepb.JoinRefusal
	detail string
}

func (r *refusal) Error() string { return r.code.String() + ": " + r.detail }

// ServeJoin serves one join connection (ALPN wireenroll.JoinALPN, no client
// certificate): one stream, one JoinRequest, one JoinResponse, then the
// connection is closed. It returns when the connection is closed.
func (s *Service) ServeJoin(ctx context.Context, qc *quic.Conn) {
	remote := qc.RemoteAddr().String()
	src := joinSource(qc.RemoteAddr())
	if !s.sources.take(src) {
		s.refuse("join refused: too many at once from one address", "remote", remote, "source", src.String(), "limit", maxJoinsPerSource)
		quicwire.CloseRefused.Close(qc, "too many joins at once from this address; try again")
		return
	}
	select {
	case s.joins <- struct{}{}:
	default:
		s.sources.release(src)
		s.refuse("join refused: too many at once", "remote", remote, "limit", maxJoins)
		quicwire.CloseRefused.Close(qc, "too many joins at once; try again")
		return
	}
	release := sync.OnceFunc(func() {
		<-s.joins
		s.sources.release(src)
	})
	defer release()
	ctx, cancel := context.WithTimeout(ctx, wireenroll.JoinTimeout)
	defer cancel()
	defer quicwire.CloseNormal.Close(qc, "")

	req, ok := s.readJoinRequest(ctx, qc, remote)
	if !ok {
		return
	}
	resp := s.join(req.msg, remote)
	deadline, _ := ctx.Deadline()
	_ = req.st.SetWriteDeadline(deadline)
	if err := transport.NewFrameWriter(req.st, wireenroll.MaxJoinFrameSize).Write(resp); err != nil {
		s.log.Warn("join: could not answer", "remote", remote, "err", err)
		return
	}
	_ = req.st.Close()
	release()
	// The Node closes the connection once it has read the answer; do not
	// cut the answer short by closing first, but do not wait long either.
	linger, stop := context.WithTimeout(ctx, answerLinger)
	defer stop()
	select {
	case <-qc.Context().Done():
	case <-linger.Done():
	}
}

// joinRequest is a join connection's request and the stream it came on.
type joinRequest struct {
	st  *quic.Stream
	msg *wirepb.JoinRequest
}

// readJoinRequest reads the connection's one request, which must arrive
// whole within joinRequestTimeout. It reports false, having closed what
// needs closing and recorded the refusal, when none came.
func (s *Service) readJoinRequest(ctx context.Context, qc *quic.Conn, remote string) (joinRequest, bool) {
	rctx, cancel := context.WithTimeout(ctx, joinRequestTimeout)
	defer cancel()
	late := func(err error) {
		s.refuse("join refused: no request in time", "remote", remote, "within", joinRequestTimeout, "err", err)
		quicwire.CloseRefused.Close(qc, fmt.Sprintf("no join request within %s; try again", joinRequestTimeout))
	}
	st, err := qc.AcceptStream(rctx)
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			late(err)
			return joinRequest{}, false
		}
		s.refuse("join: no request", "remote", remote, "err", err)
		return joinRequest{}, false
	}
	deadline, _ := rctx.Deadline()
	_ = st.SetReadDeadline(deadline)
	req := new(wirepb.JoinRequest)
	if err := transport.NewFrameReader(st, wireenroll.MaxJoinFrameSize, "join").Read(req); err != nil {
		st.CancelRead(quic.StreamErrorCode(quicwire.StreamProtocolError))
		st.CancelWrite(quic.StreamErrorCode(quicwire.StreamProtocolError))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			late(err)
			return joinRequest{}, false
		}
		s.refuse("join: unreadable request", "remote", remote, "err", err)
		return joinRequest{}, false
	}
	return joinRequest{st: st, msg: req}, true
}

// joinSource is the source a join slot is counted against: the peer's
// IPv4 address, or the /64 of its IPv6 one. An address that does not
// parse counts as the zero prefix, one source for all such.
func joinSource(a net.Addr) netip.Prefix {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// joinSources counts the join exchanges in progress per source. An entry
// is deleted when its count falls to zero, so it holds only the sources
// joining now.
type joinSources struct {
	mu sync.Mutex
	n  map[netip.Prefix]int
}

// take counts one more exchange from src, unless src has
// maxJoinsPerSource already.
func (j *joinSources) take(src netip.Prefix) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.n == nil {
		j.n = make(map[netip.Prefix]int)
	}
	if j.n[src] >= maxJoinsPerSource {
		return false
	}
	j.n[src]++
	return true
}

// release counts one exchange from src less.
func (j *joinSources) release(src netip.Prefix) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.n[src] <= 1 {
		delete(j.n, src)
		return
	}
	j.n[src]--
}

// join decides one join request. A refusal issues nothing and leaves the
// token as it was (a wrong secret does not use it up).
func (s *Service) join(req *wirepb.JoinRequest, remote string) *wirepb.JoinResponse {
	var issued CertRecord
	var chain [][]byte
	err := func() error {
		if s.opts.CA == nil {
			return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE, ErrDisabled.Error()}
		}
		if !wireenroll.ValidTokenID(req.GetTokenId()) {
			return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN, "malformed token id"}
		}
		csr, err := parseCSR(req.GetCsr())
		if err != nil {
			return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_BAD_REQUEST, err.Error()}
		}
		now := s.opts.Now()
		check := func(t TokenRecord, ok bool) error {
			switch {
			case !ok:
				return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN, "token " + req.GetTokenId()}
			case !wireenroll.SecretMatches(req.GetSecret(), t.SecretHash):
				// Said as unknown: a guess learns nothing about which part was wrong.
				return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN, "token " + req.GetTokenId()}
			case !t.Used.IsZero():
				return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN, fmt.Sprintf("token %s for node %s was used at %s", t.ID, t.NodeID, t.Used.UTC().Format(time.RFC3339))}
			case !now.Before(t.Expires):
				return &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_EXPIRED_TOKEN, fmt.Sprintf("token %s for node %s expired at %s; make a new one with `edged node add %s`", t.ID, t.NodeID, t.Expires.UTC().Format(time.RFC3339), t.NodeID)}
			}
			return nil
		}
		issue := func(nodeID string) (CertRecord, error) {
			cert, rec, err := s.sign(nodeID, csr, "join")
			if err != nil {
				return CertRecord{}, err
			}
			chain = [][]byte{cert.Raw, s.opts.CACert.Raw}
			return rec, nil
		}
		ctx := withActor(context.Background(), "join from "+remote)
		issued, err = s.store.Redeem(ctx, req.GetTokenId(), check, issue, now)
		return err
	}()
	if err != nil {
		var r *refusal
		switch {
		case errors.As(err, &r):
			s.refuse("join refused", "remote", remote, "token", req.GetTokenId(), "reason", r.code.String(), "detail", r.detail)
		case errors.Is(err, ErrDatabaseUnreachable):
			// Said to the Node as it is: it is no verdict on the token.
			s.log.Warn("join refused", "remote", remote, "token", req.GetTokenId(), "err", err)
			r = &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE, err.Error()}
		default:
			s.log.Error("join failed", "remote", remote, "token", req.GetTokenId(), "err", err)
			r = &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE, "the Edge failed to issue a certificate; see its log"}
		}
		return &wirepb.JoinResponse{Refusal: r.code, RefusalDetail: r.detail}
	}
	s.log.Info("node joined", "node", issued.NodeID, "remote", remote, "token", req.GetTokenId(), "serial", issued.Serial,
		"not_after", issued.NotAfter.UTC().Format(time.RFC3339), "version", req.GetNodeVersion())
	return &wirepb.JoinResponse{NodeId: issued.NodeID, TrustDomain: s.opts.TrustDomain, EdgeId: s.opts.EdgeID, Chain: chain}
}
