// Package nodecli adds the `edged node` commands: add (a join token and the
// `noded join` command to run on the Node), remove (revoke a Node's
// certificates and fence it), restore (lift a removal, so the Node may
// join again) and list. They talk to the running Edge
// through its admin socket in data_dir (internal/edge/registrar), so a removal
// takes effect at once; with no Edge running they open its store directly.
package nodecli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/internal/edge/datadir"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/registrar"
	"github.com/iop-dev/iop/quicwire/pki"
)

// storeLockWait is how long an offline command waits for the store's
// lock; startWait how long it waits for the socket of an Edge that holds
// the lock (it is starting).
const (
	storeLockWait = 2 * time.Second
	startWait     = 10 * time.Second
)

type cli struct {
	out        io.Writer
	configPath string
	nodeID     string
	ttl        time.Duration
	addr       string
	asJSON     bool
}

// Register adds `node add`, `node remove`, `node restore` and `node list` to app; their
// reports go to out. The returned Run runs the command app.Parse chose if it
// is one of them (a failure is an error of the command, not of its usage,
// so it is not a kingpin action).
func Register(app *kingpin.Application, out io.Writer) (Run func(cmd string) (ok bool, err error)) {
	c := &cli{out: out}
	node := app.Command("node", "Enroll, list and remove Nodes (managed mode; needs data_dir and enrollment.ca_key_file).")

	add := node.Command("add", "Make a single-use join token for a Node and print the `noded join` command to run on it.")
	add.Arg("node-id", "The Node's id (its identity is spiffe://TRUST-DOMAIN/node/NODE-ID).").Required().StringVar(&c.nodeID)
	add.Flag("ttl", "How long the token may be used.").Default(registrar.DefaultTokenTTL.String()).DurationVar(&c.ttl)
	add.Flag("addr", "The Edge's address as the Node reaches it, for the printed command (default: listen.quic, or this host's name with its port).").PlaceHolder("HOST:PORT").StringVar(&c.addr)
	add.Flag("config", "Edge configuration file (YAML).").Short('c').Required().StringVar(&c.configPath)

	remove := node.Command("remove", "Revoke a Node's certificates: the Edge refuses it at once (closing its connection) and on every reconnect.")
	remove.Arg("node-id", "The Node's id.").Required().StringVar(&c.nodeID)
	remove.Flag("config", "Edge configuration file (YAML).").Short('c').Required().StringVar(&c.configPath)

	restore := node.Command("restore", "Lift a Node's removal so that it may join again (with a new token from `edged node add`). Its revoked certificates stay refused.")
	restore.Arg("node-id", "The Node's id.").Required().StringVar(&c.nodeID)
	restore.Flag("config", "Edge configuration file (YAML).").Short('c').Required().StringVar(&c.configPath)

	list := node.Command("list", "Show enrolled Nodes: identity, certificate serial and expiry, last seen.")
	list.Flag("config", "Edge configuration file (YAML).").Short('c').Required().StringVar(&c.configPath)
	list.Flag("json", "Print JSON.").BoolVar(&c.asJSON)
	return func(cmd string) (bool, error) {
		switch cmd {
		case add.FullCommand():
			return true, c.add()
		case remove.FullCommand():
			return true, c.remove()
		case restore.FullCommand():
			return true, c.restore()
		case list.FullCommand():
			return true, c.list()
		}
		return false, nil
	}
}

// edge is the Edge of the configuration: its running process if one
// answers on the admin socket, else its store opened here.
type edge struct {
	cfg    *edgeconfig.Config
	client *registrar.SocketClient
}

func (c *cli) open() (*edge, error) {
	cfg, err := edgeconfig.Load(c.configPath)
	if err != nil {
		return nil, err
	}
	if cfg.Identity.Mode != "mtls" {
		return nil, fmt.Errorf("%s: Nodes are enrolled in mtls mode only (identity.mode is %s)", c.configPath, cfg.Identity.Mode)
	}
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("%s: set data_dir: the Edge keeps its join tokens, issued certificates and revocations there", c.configPath)
	}
	return &edge{cfg: cfg, client: registrar.NewSocketClient(cfg.DataDir)}, nil
}

// offlineAllowed refuses to open the store of dir without a running Edge
// when dir is not safe (as the Edge itself would refuse it at start), or
// when this process does not run as dir's owner: a store written by
// another user (root, typically, through sudo) leaves files the Edge's
// user cannot open, and the Edge would not start.
func offlineAllowed(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		// No Edge has run here yet: make it (0700) for the store, as the
		// Edge would.
		return datadir.Prepare(dir, registrar.StoreFile, registrar.StoreIDFile, registrar.SocketFile)
	}
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	if uid, ok := datadir.Owner(fi); ok && uid != os.Geteuid() {
		name := datadir.UserName(uid)
		who := datadir.ShellQuote(name)
		if name == strconv.Itoa(uid) {
			who = "'#" + name + "'" // sudo's form of a uid without a name
		}
		return fmt.Errorf("%w: data_dir %s belongs to %s (uid %d) and this command runs as uid %d; without a running Edge, run it as the Edge's user: sudo -u %s edged node COMMAND",
			errNotOwner, dir, name, uid, os.Geteuid(), who)
	}
	return datadir.Check(dir, registrar.StoreFile, registrar.StoreIDFile, registrar.SocketFile)
}

// errNotOwner: an offline command run by another user than data_dir's.
var errNotOwner = errors.New("not the Edge's user")

// offline runs f on the store when no Edge answers on the socket. An Edge
// that holds the store but does not answer yet is starting: online is
// tried again for a while before giving up.
func (e *edge) offline(online func() error, f func(*registrar.Service) error) error {
	if e.cfg.Cluster.Enabled() {
		return e.offlineCluster(f)
	}
	if err := offlineAllowed(e.cfg.DataDir); err != nil {
		return err
	}
	store, err := registrar.OpenStore(e.cfg.DataDir, storeLockWait, time.Now())
	if errors.Is(err, registrar.ErrStoreLocked) {
		for deadline := time.Now().Add(startWait); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if err := online(); !errors.Is(err, registrar.ErrNoEdge) {
				return err
			}
		}
		return fmt.Errorf("%w, but its admin socket %s does not answer: is it stuck?", err, filepath.Join(e.cfg.DataDir, registrar.SocketFile))
	}
	if err != nil {
		return err
	}
	defer store.Close()
	return e.serve(store, f)
}

func (c *cli) add() error {
	e, err := c.open()
	if err != nil {
		return err
	}
	if !e.cfg.Enrollment.Enabled() {
		return fmt.Errorf("%s: set enrollment.ca_key_file (the key of identity.ca_file): the Edge signs the certificate of a joining Node with it", c.configPath)
	}
	var res registrar.TokenResult
	online := func() (err error) { res, err = e.client.AddToken(c.nodeID, c.ttl); return err }
	err = online()
	if errors.Is(err, registrar.ErrNoEdge) {
		offline := false
		err = e.offline(online, func(s *registrar.Service) (err error) {
			offline = true
			res, err = s.AddToken(c.nodeID, c.ttl)
			return err
		})
		if err == nil && offline {
			fmt.Fprintf(c.out, "(edged is not running: the token is stored and works once it starts)\n")
		}
	}
	if err != nil {
		return err
	}
	addr := c.addr
	if addr == "" {
		addr = joinAddr(e.cfg.Listen.QUIC)
	}
	fmt.Fprintf(c.out, "==> Join token for node %s: single use, valid until %s\n", res.NodeID, res.Expires.UTC().Format(time.RFC3339))
	fmt.Fprintf(c.out, "    It names this Edge's CA (%s): a Node joining with it trusts only this Edge.\n", res.CAHash)
	fmt.Fprintf(c.out, "==> On the Node, run:\n\n    noded join %s --token %s --start\n\n", addr, res.Token)
	fmt.Fprintf(c.out, "It writes the Node's key (made there), certificate and node.yaml to ./iop-node (--dir to change)\n")
	fmt.Fprintf(c.out, "and starts the Node. Keep the token secret until then.\n")
	return nil
}

// joinAddr is the address to print in the join command: listen.quic when it
// names a host, else this machine's name with the port.
func joinAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "EDGE-HOST"
		}
	}
	return net.JoinHostPort(host, port)
}

func (c *cli) remove() error {
	e, err := c.open()
	if err != nil {
		return err
	}
	var res registrar.RemoveResult
	online := func() (err error) { res, err = e.client.Remove(c.nodeID); return err }
	err = online()
	if errors.Is(err, registrar.ErrNoEdge) {
		err = e.offline(online, func(s *registrar.Service) error {
			revoked, _, err := s.Remove(c.nodeID)
			res = registrar.RemoveResult{NodeID: c.nodeID, Revoked: revoked, Offline: true}
			return err
		})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "==> Removed node %s; revoked %d certificate(s)", res.NodeID, len(res.Revoked))
	if len(res.Revoked) > 0 {
		fmt.Fprintf(c.out, ": %s", strings.Join(res.Revoked, ", "))
	}
	fmt.Fprintln(c.out)
	switch {
	case res.Fenced:
		fmt.Fprintf(c.out, "==> Its connection was closed; the Edge refuses it from now on.\n")
	case res.Offline:
		fmt.Fprintf(c.out, "==> edged is not running; it refuses the node when it starts.\n")
	default:
		fmt.Fprintf(c.out, "==> It was not connected; the Edge refuses it from now on.\n")
	}
	fmt.Fprintf(c.out, "The removal stays until you lift it: to bring the node back, edged node restore %s,\n", res.NodeID)
	fmt.Fprintf(c.out, "then edged node add %s and noded join on it.\n", res.NodeID)
	return nil
}

func (c *cli) restore() error {
	e, err := c.open()
	if err != nil {
		return err
	}
	var res registrar.RestoreResult
	online := func() (err error) { res, err = e.client.Restore(c.nodeID); return err }
	err = online()
	if errors.Is(err, registrar.ErrNoEdge) {
		err = e.offline(online, func(s *registrar.Service) (err error) {
			res.NodeID = c.nodeID
			res.Removed, err = s.Restore(c.nodeID)
			return err
		})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "==> Lifted the removal of node %s (removed at %s).\n", res.NodeID, res.Removed.UTC().Format(time.RFC3339))
	fmt.Fprintf(c.out, "    The certificates it held before stay revoked, and certificates made by hand before the removal stay refused.\n")
	fmt.Fprintf(c.out, "==> To bring it back: edged node add %s, then noded join on it.\n", res.NodeID)
	return nil
}

func (c *cli) list() error {
	e, err := c.open()
	if err != nil {
		return err
	}
	var nodes []registrar.NodeStatus
	online := func() (err error) { nodes, err = e.client.List(); return err }
	err = online()
	if errors.Is(err, registrar.ErrNoEdge) {
		err = e.offline(online, func(s *registrar.Service) error {
			nodes, err = s.List()
			return err
		})
	}
	if err != nil {
		return err
	}
	if c.asJSON {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(nodes)
	}
	return printList(c.out, nodes, time.Now())
}

// printList prints one line per Node: its newest certificate, its state and
// when it was last seen.
func printList(w io.Writer, nodes []registrar.NodeStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tIDENTITY\tSTATE\tSERIAL\tEXPIRES\tLAST SEEN")
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	for _, n := range nodes {
		serial, expires := "-", "-"
		if k := len(n.Certificates); k > 0 {
			serial, expires = n.Certificates[k-1].Serial, stamp(n.Certificates[k-1].NotAfter)
		}
		state := "enrolled"
		switch {
		case !n.Removed.IsZero():
			state = "removed"
		case n.Connected != "":
			state = n.Connected
		case len(n.Certificates) == 0 && len(n.Tokens) > 0:
			state = "token pending"
		case len(n.Certificates) > 0 && now.After(n.Certificates[len(n.Certificates)-1].NotAfter):
			state = "expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.Identity, state, serial, expires, stamp(n.LastSeen))
	}
	return tw.Flush()
}

// offlineCluster runs f on the cluster's enrollment in its PostgreSQL (issue
// 22): with no Edge of this host running, the command works on what every
// Edge of the cluster reads, and a removal reaches them through the
// database's notifications.
func (e *edge) offlineCluster(f func(*registrar.Service) error) error {
	dsn, err := e.cfg.Cluster.DSN()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := clusterdb.Open(ctx, dsn, e.cfg.EdgeID, nil)
	if err != nil {
		return fmt.Errorf("cluster database: %w", err)
	}
	defer pool.Close()
	st, err := registrar.OpenPG(ctx, pool, registrar.PGOptions{EdgeID: e.cfg.EdgeID})
	if err != nil {
		return err
	}
	defer st.Close()
	return e.serve(st, f)
}

// serve runs f on a Service over store, as this Edge's configuration names
// it.
func (e *edge) serve(store registrar.Backend, f func(*registrar.Service) error) error {
	opts := registrar.Options{EdgeID: e.cfg.EdgeID, TrustDomain: e.cfg.Identity.TrustDomain}
	if e.cfg.Identity.CAFile != "" {
		var err error
		if opts.CACert, err = pki.LoadCACert(e.cfg.Identity.CAFile); err != nil {
			return err
		}
	}
	return f(registrar.New(store, opts))
}
