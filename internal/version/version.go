// Package version says which release of ledgerkeeper is running, so that an
// operator in the middle of a rollback can tell (`ledgerkeeper version`, the
// ledgerkeeper_build_info metric).
//
// A release build stamps Version and Revision with the linker (deploy/build.sh):
//
//	go build -ldflags "-X github.com/ledgerkeeper/ledgerkeeper/internal/version.Version=v1.2.3 \
//	    -X github.com/ledgerkeeper/ledgerkeeper/internal/version.Revision=0123abc" ./cmd/ledgerkeeper
//
// An unstamped build (go run, go build, go install) falls back to what the
// Go toolchain recorded in the binary (runtime/debug.ReadBuildInfo): the
// module version and the VCS revision, with "-dirty" when the work tree had
// uncommitted changes.
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the release, e.g. "v1.2.3" or git describe's
// "v1.2.3-4-g0123abc-dirty". Set at link time; empty means not stamped.
var Version string

// Revision is the VCS commit the binary was built from. Set at link time;
// empty means not stamped.
var Revision string

// Unknown is reported for a field neither the linker nor the toolchain knows.
const Unknown = "unknown"

// Info is what a binary knows about its own build.
type Info struct {
	// Version is the stamped release, else the module version ("(devel)"
	// for a build from a work tree), else the revision, else Unknown.
	Version string
	// Revision is the stamped commit, else the toolchain's vcs.revision
	// (+ "-dirty" when vcs.modified), else Unknown.
	Revision string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Get returns this binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(Version, Revision, bi)
}

// resolve prefers the linker's stamp and falls back on the build info (nil
// when the binary carries none).
func resolve(version, revision string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Revision == "" {
			info.Revision = vcsRevision(bi)
		}
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
	}
	if info.Version == "" {
		// A work-tree build has no module version: the revision is the
		// most precise name it has.
		info.Version = info.Revision
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Revision == "" {
		info.Revision = Unknown
	}
	return info
}

func vcsRevision(bi *debug.BuildInfo) string {
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	if modified && !strings.HasSuffix(rev, "-dirty") {
		rev += "-dirty"
	}
	return rev
}

// String is the one line `ledgerkeeper version` prints.
func (i Info) String() string {
	return "ledgerkeeper " + i.Version + " (revision " + i.Revision + ", " + i.GoVersion + ")"
}
