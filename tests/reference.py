"""Independent numpy references, written plainly: a Python loop over clients, float64."""

import numpy as np

RIDGE = 1e-6


def least_squares(Z, y, ridge=RIDGE):
  """One client's head: normal equations (m >= k) or the min-norm dual (m < k), ridge rule."""
  Z, y = np.asarray(Z, np.float64), np.asarray(y, np.float64)
  m, k = Z.shape
  if m >= k:
    G = Z.T @ Z
    lam = ridge * np.trace(G) / k
    return np.linalg.solve(G + lam * np.eye(k), Z.T @ y)
  G = Z @ Z.T
  lam = ridge * np.trace(G) / m
  return Z.T @ np.linalg.solve(G + lam * np.eye(m), y)


def fedrep_round(B, heads, X, y, clients, lr, head_steps=None, head_lr=None):
  """One FedRep / tau GD-GD round over `clients`; returns (B, heads, train_loss)."""
  B = np.asarray(B, np.float64)
  heads = np.array(heads, np.float64)
  new_Bs, losses = [], []
  for i in clients:
    Xi, yi = np.asarray(X[i], np.float64), np.asarray(y[i], np.float64)
    m = len(yi)
    Z = Xi @ B
    if head_steps is None:
      w = least_squares(Z, yi)
    else:
      w = heads[i].copy()
      for _ in range(head_steps):
        w = w - head_lr * Z.T @ (Z @ w - yi) / m
    residual = Z @ w - yi
    losses.append(0.5 * np.mean(residual ** 2))
    new_Bs.append(B - lr * np.outer(Xi.T @ residual, w) / m)
    heads[i] = w
  return np.mean(new_Bs, axis=0), heads, np.mean(losses)


def fedavg_round(B, w, X, y, clients, lr, local_steps):
  """One FedAvg round: each client runs local GD on (B, w) from the global model; average."""
  B, w = np.asarray(B, np.float64), np.asarray(w, np.float64)
  new_Bs, new_ws, losses = [], [], []
  for i in clients:
    Xi, yi = np.asarray(X[i], np.float64), np.asarray(y[i], np.float64)
    m = len(yi)
    losses.append(0.5 * np.mean((Xi @ B @ w - yi) ** 2))
    Bi, wi = B.copy(), w.copy()
    for _ in range(local_steps):
      residual = Xi @ Bi @ wi - yi
      grad_B = np.outer(Xi.T @ residual, wi) / m
      grad_w = Bi.T @ Xi.T @ residual / m
      Bi, wi = Bi - lr * grad_B, wi - lr * grad_w
    new_Bs.append(Bi)
    new_ws.append(wi)
  return np.mean(new_Bs, axis=0), np.mean(new_ws, axis=0), np.mean(losses)


def method_of_moments(X, y, k):
  """Top-k eigenvectors of (1/n) sum_i (1/m_i) sum_j y_ij^2 x_ij x_ij^T; X, y: per-client
  arrays [m_i, d], [m_i] (m_i may differ)."""
  n, d = len(X), X[0].shape[-1]
  moments = np.zeros((d, d))
  for i in range(n):
    m = len(y[i])
    for j in range(m):
      x = np.asarray(X[i][j], np.float64)
      moments += float(y[i][j]) ** 2 * np.outer(x, x) / (n * m)
  values, vectors = np.linalg.eigh(moments)
  return vectors[:, np.argsort(values)[::-1][:k]]


def test_error(thetas, X_test, y_test, test_counts=None):
  """Mean over clients of the mean squared error of theta_i on client i's test samples (its
  first test_counts[i]; None: all); clients without test samples are left out."""
  counts = [len(y_test[i]) for i in range(len(thetas))] if test_counts is None else test_counts
  return np.mean([np.mean((np.asarray(X_test[i][:t], np.float64) @ thetas[i] - y_test[i][:t])
                          ** 2) for i, t in enumerate(counts) if t])


def fedavg_population_round(B, w, theta_stars, clients, lr, local_steps):
  """One FedAvg round on population losses 1/2 ||B w - theta_i*||^2."""
  B, w = np.asarray(B, np.float64), np.asarray(w, np.float64)
  new_Bs, new_ws = [], []
  for i in clients:
    Bi, wi = B.copy(), w.copy()
    for _ in range(local_steps):
      residual = Bi @ wi - theta_stars[i]
      Bi, wi = Bi - lr * np.outer(residual, wi), wi - lr * Bi.T @ residual
    new_Bs.append(Bi)
    new_ws.append(wi)
  return np.mean(new_Bs, axis=0), np.mean(new_ws, axis=0)


def fine_tune(B, w, X, y, lr, steps, train_body=True):
  """Full-batch GD on (1/2n)||X B w - y||^2 from (B, w); returns B w."""
  B, w = np.asarray(B, np.float64), np.asarray(w, np.float64)
  for _ in range(steps):
    grad = X.T @ (X @ B @ w - y) / len(y)
    B, w = (B - lr * np.outer(grad, w) if train_body else B), w - lr * B.T @ grad
  return B @ w


def flute_round(B, heads, X, y, lr, reg_lr, gamma1, gamma2, scale):
  """One linear FLUTE round (Eqs. 5-6) over all clients; X, y: per-client arrays [N_i, d],
  [N_i]; L_i = (scale / N_i) ||X_i B w_i - y_i||^2. Returns (B, heads)."""
  B, W = np.asarray(B, np.float64), np.asarray(heads, np.float64).T  # W [k, M]
  grad_B, grad_W = np.zeros_like(B), np.zeros_like(W)
  for i in range(W.shape[1]):
    Xi, yi = np.asarray(X[i], np.float64), np.asarray(y[i], np.float64)
    residual = Xi @ B @ W[:, i] - yi
    grad_B += 2 * scale / len(yi) * np.outer(Xi.T @ residual, W[:, i])
    grad_W[:, i] = 2 * scale / len(yi) * B.T @ Xi.T @ residual
  # Eq. 6: gradients of -g1 ||BW||^2 + g2 (||B^T B||^2 + ||W W^T||^2) at the previous iterate
  reg_B = -2 * gamma1 * B @ W @ W.T + 4 * gamma2 * B @ B.T @ B
  reg_W = -2 * gamma1 * B.T @ B @ W + 4 * gamma2 * W @ W.T @ W
  B_new = B - lr * grad_B - reg_lr * reg_B
  W_new = W - lr * grad_W - reg_lr * reg_W
  return B_new, W_new.T
