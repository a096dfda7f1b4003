package version

import (
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: "github.com/ledgerkeeper/ledgerkeeper", Version: "(devel)"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: rev},
				{Key: "vcs.modified", Value: modified},
			},
		}
	}
	tests := []struct {
		name              string
		version, revision string
		bi                *debug.BuildInfo
		want              Info
	}{
		{"stamped wins over the toolchain", "v1.2.3", "abc123", vcs("fff", "true"),
			Info{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"}},
		{"work tree: the revision names the version", "", "", vcs("0123abc", "false"),
			Info{Version: "0123abc", Revision: "0123abc", GoVersion: "go1.26.8"}},
		{"dirty work tree says so", "", "", vcs("0123abc", "true"),
			Info{Version: "0123abc-dirty", Revision: "0123abc-dirty", GoVersion: "go1.26.8"}},
		{"go install of a tagged module", "", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}},
			Info{Version: "v1.4.0", Revision: Unknown, GoVersion: "go1.26.8"}},
		{"stamped version, revision from the toolchain", "v2.0.0", "", vcs("0123abc", "false"),
			Info{Version: "v2.0.0", Revision: "0123abc", GoVersion: "go1.26.8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resolve(tt.version, tt.revision, tt.bi); got != tt.want {
				t.Errorf("resolve = %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("no build info at all", func(t *testing.T) {
		got := resolve("", "", nil)
		if got.Version != Unknown || got.Revision != Unknown || got.GoVersion == "" {
			t.Errorf("resolve(nil) = %+v, want unknown version and revision and the runtime's Go version", got)
		}
	})
}
