/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// kokkosmoe_cli_matrix: runs a CLI once per line of a bad-argument matrix and checks that every case is handled:
// the expected exit status, exactly one line on stderr matching the expected message, no signal, no abort or
// std::terminate, no hang (a time limit per case). The matrix files live beside the CLIs (core/app/tests/,
// sharding/app/tests/); their format:
//
//   # comment
//   <exit status> <err|out> <ECMAScript regex> ::: <arg> <arg> ...
//
// Arguments are separated by spaces; inside one, \s is a space, \e (alone) the empty argument, \xNN a byte and \\ a
// backslash. Placeholders: @FIXTURES@ (--fixtures DIR), @DIR@ (a scratch directory), @FIFO@ (a FIFO nobody
// writes), @BIG@ (a sparse regular file of 65 MiB), @EMPTY@ (an empty file), @GARBAGE@ (a file of random bytes),
// @MISSING@ (a path that does not exist), @LONG@ (100000 'x'), @LONGNUM@ (100000 '9'). An argument
// "@ENV:NAME=VALUE" sets an environment variable for the case instead of being passed.
//
//   kokkosmoe_cli_matrix <program> <matrix file> [--fixtures DIR] [--min-cases N]

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Case {
  int line = 0;
  int status = 0;
  bool on_stderr = true;
  std::string regex;
  std::vector<std::string> args, env;
};

struct Outcome {
  int status = -1;  // exit status, or -1
  int signal = 0;
  bool timed_out = false;
  std::string out, err;
};

std::string unescape(const std::string& tok) {
  if (tok == "\\e") return {};
  std::string r;
  for (std::size_t k = 0; k < tok.size(); ++k) {
    if (tok[k] != '\\' || k + 1 >= tok.size()) {
      r += tok[k];
      continue;
    }
    const char n = tok[++k];
    if (n == 's') {
      r += ' ';
    } else if (n == 'x' && k + 2 < tok.size()) {
      r += static_cast<char>(std::stoi(tok.substr(k + 1, 2), nullptr, 16));
      k += 2;
    } else {
      r += n;
    }
  }
  return r;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
  return s;
}

// Runs program + args with a time limit, capturing stdout and stderr.
Outcome run(const std::string& program, const std::vector<std::string>& args, const std::vector<std::string>& env,
            double limit_s) {
  Outcome o;
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    std::perror("execv");
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  const auto start = std::chrono::steady_clock::now();
  int wstatus = 0;
  bool done = false;
  char buf[65536];
  for (;;) {
    for (auto [fd, dst] : {std::pair{out_pipe[0], &o.out}, std::pair{err_pipe[0], &o.err}})
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) dst->append(buf, static_cast<std::size_t>(n));
    if (done) break;
    const pid_t w = waitpid(pid, &wstatus, WNOHANG);
    if (w == pid) {
      done = true;  // one more read for what is left in the pipes
      continue;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      o.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  close(out_pipe[0]);
  close(err_pipe[0]);
  if (!o.timed_out) {
    if (WIFEXITED(wstatus)) o.status = WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) o.signal = WTERMSIG(wstatus);
  }
  return o;
}

std::string shown(const std::string& s) {
  std::string r;
  for (unsigned char c : s.substr(0, 600)) r += (c == '\n' ? std::string("\\n") : std::string(1, static_cast<char>(c)));
  return r + (s.size() > 600 ? "..." : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: kokkosmoe_cli_matrix <program> <matrix file> [--fixtures DIR] [--min-cases N]\n";
    return 2;
  }
  const std::string program = argv[1], matrix = argv[2];
  std::string fixtures;
  int min_cases = 40;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--fixtures") fixtures = argv[i + 1];
    if (std::string(argv[i]) == "--min-cases") min_cases = std::atoi(argv[i + 1]);
  }

  // Scratch files for the placeholders.
  char tmpl[] = "/tmp/kokkosmoe_cli_matrix.XXXXXX";
  const char* dir_c = mkdtemp(tmpl);
  if (!dir_c) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = dir_c;
  const std::string fifo = dir + "/fifo", big = dir + "/big.xml", empty = dir + "/empty.xml",
                    garbage = dir + "/garbage.xml";
  if (mkfifo(fifo.c_str(), 0600) != 0) std::perror("mkfifo");
  {
    std::ofstream(empty.c_str());
    std::ofstream g(garbage.c_str(), std::ios::binary);
    unsigned x = 12345;
    for (int k = 0; k < 4096; ++k) g.put(static_cast<char>((x = x * 1103515245u + 12345u) >> 24));
    const int fd = open(big.c_str(), O_CREAT | O_WRONLY, 0600);
    if (fd < 0 || ftruncate(fd, (65ll << 20) + 1) != 0) std::perror("big file");
    if (fd >= 0) close(fd);
  }

  std::ifstream in(matrix);
  if (!in) {
    std::cerr << "cannot read " << matrix << "\n";
    return 1;
  }
  std::vector<Case> cases;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.empty() || text[0] == '#') continue;
    const auto sep = text.find(" ::: ");
    const bool no_args = sep == std::string::npos && text.size() >= 4 && text.substr(text.size() - 4) == " :::";
    const std::string head = no_args ? text.substr(0, text.size() - 4) : text.substr(0, sep);
    if (sep == std::string::npos && !no_args) {
      std::cerr << matrix << ":" << line << ": no ' ::: ' separator\n";
      return 1;
    }
    Case c;
    c.line = line;
    const auto s1 = head.find(' '), s2 = head.find(' ', s1 + 1);
    if (s1 == std::string::npos || s2 == std::string::npos) {
      std::cerr << matrix << ":" << line << ": expected '<status> <err|out> <regex>'\n";
      return 1;
    }
    c.status = std::atoi(head.substr(0, s1).c_str());
    c.on_stderr = head.substr(s1 + 1, s2 - s1 - 1) == "err";
    c.regex = head.substr(s2 + 1);
    if (!no_args) {
      std::string rest = text.substr(sep + 5);
      std::size_t k = 0;
      while (k < rest.size()) {
        const auto e = rest.find(' ', k);
        std::string tok = unescape(rest.substr(k, e == std::string::npos ? std::string::npos : e - k));
        k = e == std::string::npos ? rest.size() : e + 1;
        tok = replace_all(tok, "@FIXTURES@", fixtures);
        tok = replace_all(tok, "@DIR@", dir);
        tok = replace_all(tok, "@FIFO@", fifo);
        tok = replace_all(tok, "@BIG@", big);
        tok = replace_all(tok, "@EMPTY@", empty);
        tok = replace_all(tok, "@GARBAGE@", garbage);
        tok = replace_all(tok, "@MISSING@", dir + "/no-such-file.xml");
        tok = replace_all(tok, "@LONGNUM@", std::string(100000, '9'));
        tok = replace_all(tok, "@LONG@", std::string(100000, 'x'));
        if (tok.rfind("@ENV:", 0) == 0)
          c.env.push_back(tok.substr(5));
        else
          c.args.push_back(tok);
      }
    }
    cases.push_back(c);
  }

  int failed = 0, error_cases = 0;
  for (const Case& c : cases) {
    const Outcome o = run(program, c.args, c.env, 30.0);
    std::string why;
    std::string stream = c.on_stderr ? o.err : o.out;
    if (!stream.empty() && stream.back() == '\n') stream.pop_back();  // so that '$' anchors at the message's end
    if (o.timed_out)
      why = "did not finish within 30 s (hang)";
    else if (o.signal)
      why = "killed by signal " + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")";
    else if (o.status != c.status)
      why = "exit status " + std::to_string(o.status) + ", expected " + std::to_string(c.status);
    else if (o.err.find("terminate called") != std::string::npos || o.err.find("Kokkos::abort") != std::string::npos)
      why = "std::terminate or Kokkos::abort";
    else if (c.status != 0 && (o.err.empty() || o.err.back() != '\n' || o.err.find('\n') != o.err.size() - 1))
      why = "stderr is not exactly one line";
    else {
      try {
        if (!std::regex_search(stream, std::regex(c.regex))) why = "output does not match /" + c.regex + "/";
      } catch (const std::regex_error& e) {
        why = std::string("bad regex in the matrix: ") + e.what();
      }
    }
    if (c.status != 0) ++error_cases;
    std::string args;
    for (const auto& e : c.env) args += "[" + e + "] ";
    for (const auto& a : c.args) args += (a.size() > 60 ? a.substr(0, 60) + "..." : a) + " ";
    if (!why.empty()) {
      ++failed;
      std::cout << "FAIL line " << c.line << ": " << shown(args) << "\n  " << why << "\n  stdout: " << shown(o.out)
                << "\n  stderr: " << shown(o.err) << "\n";
    } else {
      std::cout << "ok   line " << c.line << ": exit " << o.status << ": " << shown(args) << "\n    "
                << shown(c.on_stderr ? o.err : o.out.substr(0, 200)) << "\n";
    }
  }
  unlink(fifo.c_str());
  unlink(big.c_str());
  unlink(empty.c_str());
  unlink(garbage.c_str());
  rmdir(dir.c_str());
  std::cout << program << ": " << (cases.size() - static_cast<std::size_t>(failed)) << "/" << cases.size()
            << " cases handled (" << error_cases << " bad-argument cases)\n";
  if (error_cases < min_cases) {
    std::cout << "the matrix has fewer than " << min_cases << " bad-argument cases\n";
    return 1;
  }
  return failed ? 1 : 0;
}
