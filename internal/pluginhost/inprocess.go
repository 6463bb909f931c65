package pluginhost

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/sdk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// inProcessBuffer is the in-memory connection's buffer in each direction.
const inProcessBuffer = 1 << 20

// StartInProcess serves a in the host's own process and returns a Plugin
// for it, with the same API and over the same gRPC path (the plugin
// protocol, the conversions, panic recovery) as a plugin process, minus
// the process: an in-memory connection, no handshake, no TLS. Pid is 0 and
// Exited is closed by Close. Tests and embedded adapters use it.
func StartInProcess(ctx context.Context, a sdk.Adapter) (*Plugin, error) {
	lis := bufconn.Listen(inProcessBuffer)
	srvCtx, stopServer := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := sdk.ServeListener(srvCtx, a, lis); err != nil {
			slog.Default().Error("in-process adapter server stopped", "error", err)
		}
	}()
	conn, err := grpc.NewClient("passthrough:///in-process",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// As go-plugin does for a plugin process: the plugin side bounds
		// what it accepts, the host takes what the plugin sends.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)),
	)
	if err != nil {
		stopServer()
		wg.Wait()
		return nil, fmt.Errorf("pluginhost: in-process connection: %w", err)
	}
	exited := make(chan struct{})
	p := &Plugin{
		name:       "in-process",
		rpc:        pluginpb.NewAdapterClient(conn),
		exited:     exited,
		exitStatus: func() string { return "stopped in process" },
		closing:    make(chan struct{}),
		stop: func() {
			_ = conn.Close()
			stopServer()
			wg.Wait()
			_ = lis.Close()
			close(exited)
		},
	}
	if err := p.describe(ctx); err != nil {
		p.stop()
		return nil, err
	}
	if p.info.Name != "" {
		p.name = p.info.Name
	}
	return p, nil
}
