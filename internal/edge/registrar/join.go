package registrar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// maxJoins bounds the join exchanges served at once: they come from
// unauthenticated peers, so each is also bounded in size
// (wireenroll.MaxJoinFrameSize) and time (wireenroll.JoinTimeout).
const maxJoins = 16

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
	select {
	case s.joins <- struct{}{}:
		defer func() { <-s.joins }()
	default:
		s.refuse("join refused: too many at once", "remote", remote)
		quicwire.CloseRefused.Close(qc, "too many joins at once; try again")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wireenroll.JoinTimeout)
	defer cancel()
	defer quicwire.CloseNormal.Close(qc, "")
	st, err := qc.AcceptStream(ctx)
	if err != nil {
		s.refuse("join: no request", "remote", remote, "err", err)
		return
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	req := new(wirepb.JoinRequest)
	if err := transport.NewFrameReader(st, wireenroll.MaxJoinFrameSize, "join").Read(req); err != nil {
		s.refuse("join: unreadable request", "remote", remote, "err", err)
		st.CancelRead(quic.StreamErrorCode(quicwire.StreamProtocolError))
		st.CancelWrite(quic.StreamErrorCode(quicwire.StreamProtocolError))
		return
	}
	resp := s.join(req, remote)
	if err := transport.NewFrameWriter(st, wireenroll.MaxJoinFrameSize).Write(resp); err != nil {
		s.log.Warn("join: could not answer", "remote", remote, "err", err)
		return
	}
	_ = st.Close()
	// The Node closes the connection once it has read the answer; do not
	// cut the answer short by closing first.
	select {
	case <-qc.Context().Done():
	case <-ctx.Done():
	}
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
		issued, err = s.store.Redeem(req.GetTokenId(), check, issue, now)
		return err
	}()
	if err != nil {
		var r *refusal
		if !errors.As(err, &r) {
			s.log.Error("join failed", "remote", remote, "token", req.GetTokenId(), "err", err)
			r = &refusal{wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE, "the Edge failed to issue a certificate; see its log"}
		} else {
			s.refuse("join refused", "remote", remote, "token", req.GetTokenId(), "reason", r.code.String(), "detail", r.detail)
		}
		return &wirepb.JoinResponse{Refusal: r.code, RefusalDetail: r.detail}
	}
	s.log.Info("node joined", "node", issued.NodeID, "remote", remote, "token", req.GetTokenId(), "serial", issued.Serial,
		"not_after", issued.NotAfter.UTC().Format(time.RFC3339), "version", req.GetNodeVersion())
	return &wirepb.JoinResponse{NodeId: issued.NodeID, TrustDomain: s.opts.TrustDomain, EdgeId: s.opts.EdgeID, Chain: chain}
}
