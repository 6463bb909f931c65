package ollama

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/sdk"
)

func TestInfoAndCapabilities(t *testing.T) {
	a := New()
	info := a.Info()
	if info.Name != "ollama" || info.Version == "" || len(info.ConfigFields) != 4 {
		t.Fatalf("info %+v", info)
	}
	want := []string{sdk.CapListTargets, sdk.CapTunnel, sdk.CapProbe, sdk.CapClose, sdk.CapComplete, sdk.CapEmbed, sdk.CapTunnelRoute}
	if got := sdk.Capabilities(a); !slices.Equal(got, want) {
		t.Fatalf("capabilities %v", got)
	}
}

func TestConfigureIsStrict(t *testing.T) {
	cases := []struct {
		cfg  string
		want string // "" means accepted
	}{
		{``, ""},
		{`{}`, ""},
		{`{"base_url":"https://gpu-box:11434/ollama","keep_alive":"10m","headers":{"X-Team":"ml"}}`, ""},
		{`{"keep_alive":"-1"}`, ""},
		{`{"base_url":"http://x","request_timeout":"5s"}`, `unknown field "request_timeout"`},
		{`{"base_url":"ftp://x"}`, "base_url"},
		{`{"base_url":"http://user:pw@x"}`, "base_url"},
		{`{"base_url":"127.0.0.1:11434"}`, "base_url"},
		{`{"keep_alive":"soon"}`, "keep_alive"},
		{`{"headers":{"Bad Name":"x"}}`, "invalid header"},
		{`{"headers":{"Connection":"close"}}`, "managed by the adapter"},
		{`{"headers":{"X-A":"line\nbreak"}}`, "invalid header"},
		{`[1]`, "config"},
	}
	for _, tc := range cases {
		err := New().Configure(context.Background(), sdk.Config(tc.cfg))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, sdk.ErrInvalidRequest)):
			t.Errorf("%s: err %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestKeepAliveEncoding(t *testing.T) {
	for in, want := range map[string]string{"5m": `"5m"`, "-1s": `"-1s"`, "-1": `-1`, "300": `300`, "0": `"0"`, "1.5": `1.5`} {
		got, err := keepAliveJSON(in)
		if err != nil || string(got) != want {
			t.Errorf("%q → %s %v, want %s", in, got, err, want)
		}
	}
}
