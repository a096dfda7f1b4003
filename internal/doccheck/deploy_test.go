package doccheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The shipped ConfigMap is a configuration `config check` accepts, with
// the example Secret's values, and every ${VAR} it uses is in the serve
// container's env, taken from that Secret.
func TestDeployConfigMapPassesConfigCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal([]byte(read(t, "deploy/kubernetes/configmap.yaml")), &cm); err != nil {
		t.Fatal(err)
	}
	file, ok := cm.Data["ledgerkeeper.yaml"]
	if !ok {
		t.Fatal("configmap.yaml has no data.ledgerkeeper.yaml")
	}
	var secret struct {
		StringData map[string]string `yaml:"stringData"`
	}
	if err := yaml.Unmarshal([]byte(read(t, "deploy/kubernetes/secret.example.yaml")), &secret); err != nil {
		t.Fatal(err)
	}
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name string `yaml:"name"`
						Env  []struct {
							Name string `yaml:"name"`
						} `yaml:"env"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(read(t, "deploy/kubernetes/deployment.yaml")), &dep); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == "ledgerkeeper" {
			for _, e := range c.Env {
				env = append(env, e.Name)
			}
		}
	}
	for _, m := range regexp.MustCompile(`\$\{([A-Z0-9_]+)\}`).FindAllStringSubmatch(file, -1) {
		if !slices.Contains(env, m[1]) {
			t.Errorf("configmap.yaml uses ${%s}; the ledgerkeeper container's env (%v) does not set it", m[1], env)
		}
		if _, ok := secret.StringData[m[1]]; !ok {
			t.Errorf("configmap.yaml uses ${%s}; secret.example.yaml does not show it", m[1])
		}
	}

	path := filepath.Join(t.TempDir(), "ledgerkeeper.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "config", "check", "--config", path)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for k, v := range secret.StringData {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("config check of deploy/kubernetes/configmap.yaml: %v\n%s", err, out)
	}
}
