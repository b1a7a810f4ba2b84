// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @dev The forge cheatcodes these tests use. forge-std is not published on npm (only an old,
///      unofficial copy), so the project declares the cheatcode interface it needs itself.
interface Vm {
    struct Log {
        bytes32[] topics;
        bytes data;
        address emitter;
    }

    function prank(address sender) external;
    function startPrank(address sender) external;
    function stopPrank() external;
    function deal(address who, uint256 newBalance) external;
    function etch(address target, bytes calldata newRuntimeBytecode) external;
    function warp(uint256 newTimestamp) external;
    function roll(uint256 newHeight) external;
    function chainId(uint256 newChainId) external;
    function setBlockhash(uint256 blockNumber, bytes32 blockHash) external;
    function snapshotState() external returns (uint256 snapshotId);
    function revertToState(uint256 snapshotId) external returns (bool success);
    function expectRevert(bytes calldata revertData) external;
    function expectRevert(bytes4 revertData) external;
    function expectRevert() external;
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function addr(uint256 privateKey) external pure returns (address);
    function assume(bool condition) external pure;
    function label(address account, string calldata newLabel) external;
    function recordLogs() external;
    function getRecordedLogs() external returns (Log[] memory logs);
    function readFile(string calldata path) external view returns (string memory data);
    function parseJsonUint(string calldata json, string calldata key) external pure returns (uint256);
    function parseJsonAddress(string calldata json, string calldata key) external pure returns (address);
    function parseJsonBytes32(string calldata json, string calldata key) external pure returns (bytes32);
    function parseJsonBytes(string calldata json, string calldata key) external pure returns (bytes memory);
    function parseJsonString(string calldata json, string calldata key) external pure returns (string memory);
    function parseJsonBytes32Array(string calldata json, string calldata key)
        external
        pure
        returns (bytes32[] memory);
    function toString(uint256 value) external pure returns (string memory);
    function assertEq(uint256 left, uint256 right, string calldata message) external pure;
    function assertEq(bytes32 left, bytes32 right, string calldata message) external pure;
    function assertEq(address left, address right, string calldata message) external pure;
    function assertEq(bool left, bool right, string calldata message) external pure;
    function assertEq(uint256 left, uint256 right) external pure;
    function assertEq(bytes32 left, bytes32 right) external pure;
    function assertEq(address left, address right) external pure;
    function assertEq(bool left, bool right) external pure;
    function assertTrue(bool condition, string calldata message) external pure;
    function assertFalse(bool condition, string calldata message) external pure;
    function assertLe(uint256 left, uint256 right, string calldata message) external pure;
    function assertGe(uint256 left, uint256 right, string calldata message) external pure;
}

/// @dev Minimal test base: the cheatcode handle, assertions that revert (forge 1.x semantics),
///      `bound`, and the invariant-target hooks forge reads.
abstract contract Test {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    bool public IS_TEST = true;

    struct FuzzSelector {
        address addr;
        bytes4[] selectors;
    }

    address[] private _targetContracts;
    FuzzSelector[] private _targetSelectors;

    function targetContract(address target) internal {
        _targetContracts.push(target);
    }

    /// @dev Read by forge's invariant runner.
    function targetContracts() public view returns (address[] memory) {
        return _targetContracts;
    }

    function targetSelector(FuzzSelector memory selector) internal {
        _targetSelectors.push(selector);
    }

    /// @dev Read by forge's invariant runner.
    function targetSelectors() public view returns (FuzzSelector[] memory) {
        return _targetSelectors;
    }

    address[] private _targetSenders;

    function targetSender(address sender) internal {
        _targetSenders.push(sender);
    }

    /// @dev Read by forge's invariant runner: the only msg.senders it uses.
    function targetSenders() public view returns (address[] memory) {
        return _targetSenders;
    }

    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        require(lo <= hi, "bound: lo > hi");
        if (x >= lo && x <= hi) return x;
        uint256 size = hi - lo + 1;
        return lo + (x % size);
    }
}
