// Command control-plane runs a real Kubernetes control plane on loopback for the project's tests:
// embedded etcd and kube-apiserver in this process, and kube-controller-manager (deployment,
// replicaset, garbage-collector, namespace, serviceaccount and disruption controllers) as a child process of
// the same binary. No kubelet, no scheduler: tests play the kubelet by writing Pod status.
//
// Usage:
//
//	control-plane --dir DIR [--port N] [--watch-stdin]
//
// When the API server is ready and the controller manager has created the default ServiceAccount,
// it writes DIR/kubeconfig (a cluster-admin token user) and prints one JSON line to stdout:
// {"kubeconfig": "...", "server": "https://127.0.0.1:N"}. It stops on SIGINT/SIGTERM, and with
// --watch-stdin also when its stdin closes, so a test that dies cannot leave it running.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

// controllers run by the child kube-controller-manager: what Deployments, ownerReference garbage
// collection and namespaces need, nothing that expects nodes or a cloud.
const controllers = "deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,disruption-controller"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "controller-manager" {
		cmd := kcm.NewControllerManagerCommand()
		cmd.SetArgs(os.Args[2:])
		if err := cmd.Execute(); err != nil {
			fmt.Fprintln(os.Stderr, "controller-manager:", err)
			os.Exit(1)
		}
		return
	}
	dir := flag.String("dir", "", "state directory (etcd data, certificates, kubeconfig); required")
	port := flag.Int("port", 0, "API server port on 127.0.0.1 (0: pick a free one)")
	watchStdin := flag.Bool("watch-stdin", false, "stop when stdin reaches EOF")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "control-plane: --dir is required")
		os.Exit(2)
	}
	if err := run(*dir, *port, *watchStdin); err != nil {
		fmt.Fprintln(os.Stderr, "control-plane:", err)
		os.Exit(1)
	}
}

func run(dir string, port int, watchStdin bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sigs; cancel() }()
	if watchStdin {
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	}

	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := writeCredentials(dir)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}

	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	if port == 0 {
		if port, err = freePort(); err != nil {
			return err
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	apiErr := make(chan error, 1)
	go func() { apiErr <- runAPIServer(ctx, dir, port, etcdURL, files) }()

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, server, files); err != nil {
		return err
	}
	client, err := clientFor(kubeconfig)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, client, apiErr); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}

	child, err := startControllerManager(ctx, dir, kubeconfig, files)
	if err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	kcmErr := make(chan error, 1)
	go func() { kcmErr <- child.Wait() }()
	if err := waitDefaultServiceAccount(ctx, client, kcmErr); err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}

	line, _ := json.Marshal(map[string]string{"kubeconfig": kubeconfig, "server": server})
	fmt.Println(string(line))

	select {
	case <-ctx.Done():
	case err := <-apiErr:
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-kcmErr:
		return fmt.Errorf("kube-controller-manager stopped: %v", err)
	}
	if child.Process != nil {
		_ = child.Process.Signal(syscall.SIGTERM)
	}
	return nil
}

type credentials struct {
	caCert, servingCert, servingKey, saKey, tokens, token string
}

// writeCredentials writes a serving certificate for 127.0.0.1 (with its CA), a ServiceAccount
// signing key and a static token file whose one user is in system:masters.
func writeCredentials(dir string) (credentials, error) {
	c := credentials{
		servingCert: filepath.Join(dir, "serving.crt"),
		servingKey:  filepath.Join(dir, "serving.key"),
		caCert:      filepath.Join(dir, "ca.crt"),
		saKey:       filepath.Join(dir, "service-account.key"),
		tokens:      filepath.Join(dir, "tokens.csv"),
	}
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return c, err
	}
	saPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return c, err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return c, err
	}
	c.token = hex.EncodeToString(raw)
	for path, body := range map[string][]byte{
		c.servingCert: certPEM,
		c.caCert:      certPEM, // the chain ends in the self-signed CA, which clients trust
		c.servingKey:  keyPEM,
		c.saKey:       saPEM,
		c.tokens:      []byte(c.token + ",admin,admin,system:masters\n"),
	} {
		if err := os.WriteFile(path, body, 0o600); err != nil {
			return c, err
		}
	}
	return c, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true // test data only; fsync dominates start-up on slow disks
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	peerURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("not ready after 60 s")
	}
}

func runAPIServer(ctx context.Context, dir string, port int, etcdURL string, c credentials) error {
	opts := apiserveroptions.NewServerRunOptions()
	fs := opts.Flags()
	flags := fs.FlagSet("all")
	for _, f := range fs.FlagSets {
		flags.AddFlagSet(f)
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + c.servingCert,
		"--tls-private-key-file=" + c.servingKey,
		"--token-auth-file=" + c.tokens,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + c.saKey,
		"--service-account-signing-key-file=" + c.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	if err := flags.Parse(args); err != nil {
		return err
	}
	if err := opts.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	completed, err := opts.Complete(ctx)
	if err != nil {
		return err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("%v", errs)
	}
	return apiserver.Run(ctx, completed)
}

func writeKubeconfig(path, server string, c credentials) error {
	ca, err := os.ReadFile(c.caCert)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["control-plane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.token}
	cfg.Contexts["control-plane"] = &clientcmdapi.Context{Cluster: "control-plane", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "control-plane"
	return clientcmd.WriteToFile(*cfg, path)
}

func clientFor(kubeconfig string) (*kubernetes.Clientset, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

func waitReady(ctx context.Context, client *kubernetes.Clientset, failed <-chan error) error {
	deadline := time.After(120 * time.Second)
	for {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		select {
		case err := <-failed:
			return fmt.Errorf("stopped before ready: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("not ready after 120 s: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func startControllerManager(ctx context.Context, dir, kubeconfig string, c credentials) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "controller-manager",
		"--kubeconfig="+kubeconfig,
		"--controllers="+controllers,
		"--service-account-private-key-file="+c.saKey,
		"--root-ca-file="+c.caCert,
		"--leader-elect=false",
		"--secure-port=0",
		"--concurrent-gc-syncs=5",
		"--cluster-signing-duration=1h",
	)
	cmd.Dir = dir
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	// The child must not outlive this process, however this one ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd, cmd.Start()
}

func waitDefaultServiceAccount(ctx context.Context, client *kubernetes.Clientset, failed <-chan error) error {
	deadline := time.After(120 * time.Second)
	for {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case err := <-failed:
			return fmt.Errorf("exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("no default ServiceAccount after 120 s: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
