package simulator_test

import (
	"testing"

	"github.com/iop-dev/iop/plugins/simulator"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// conformanceConfig has a quick model, a slow one to cancel, and models
// that fail with the fail knob.
const conformanceConfig = `{"models":[
	{"name":"sim","tokens":8,"token_interval":"1ms"},
	{"name":"slow","tokens":1000,"token_interval":"20ms"},
	{"name":"limited","tokens":4,"token_interval":"0s","fail":{"kind":"rate_limited","after_tokens":1}},
	{"name":"down","fail":{"kind":"unavailable"}},
	{"name":"locked","fail":{"kind":"unauthenticated"}}
]}`

// The simulator passes the adapter conformance kit through the real plugin
// path. (noded's tests run the kit on it as a plugin process too.)
func TestSimulatorConforms(t *testing.T) {
	sdktest.Run(t, sdktest.Subject{Adapter: func() sdk.Adapter { return simulator.New() }}, sdktest.Options{
		Config:        sdk.Config(conformanceConfig),
		Target:        "sim",
		SlowTarget:    "slow",
		UnknownTarget: "no-such-model",
		ErrorCases: []sdktest.ErrorCase{
			{Name: "rate limited after a token", Target: "limited", Want: sdk.KindRateLimited},
			{Name: "unavailable", Target: "down", Want: sdk.KindUnavailable},
			{Name: "unauthenticated", Target: "locked", Want: sdk.KindUnauthenticated},
		},
	})
}
